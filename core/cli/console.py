"""Terminal rendering of run events, shared by `hone train` and `hone demo`: a progress bar for steps, tables
for dataset reports, one line for notices, checkpoints and evaluations."""

from __future__ import annotations

import logging
import time
import warnings

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hone.core import events
from hone.core.train.run_dir import speed_choice, step_line

# Without a terminal (nohup, CI, a log file) there is no progress bar: a plain step line at most this often, plus
# the first and last step.
PLAIN_STEP_EVERY_S = 30.0


def quiet_library_noise() -> None:
    """Silence library messages a `hone` user cannot act on (this process only; call before the libraries load).

    - bitsandbytes, on CPUs with AVX-512 BF16, warns at import that it could not fetch an optional CPU kernel from
      the Hub and suggests installing `kernels`; Hone never runs 4-bit layers on the CPU.
    - peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model, which warns on
      every run; nothing in the user's config causes it.
    """
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


# Skipped rows a run's data table lists by name; the count covers all, and `hone data check` lists every one.
SHOWN_SKIPPED = 5


def dataset_table(report: events.DatasetReport) -> Table:
    table = Table(title=f"{report.split} data ({report.format or 'auto'}): {', '.join(report.files)}",
                  show_header=False, title_justify="left")
    table.add_row("rows read / kept", f"{report.rows_read} / {report.rows_kept}")
    skipped = sum(report.skipped.values())
    if skipped:
        table.add_row("rows skipped", f"{skipped:,}")
    for reason, count in report.skipped.items():
        table.add_row(f"  {reason}", f"{count:,}")
    for example in report.skipped_examples[:SHOWN_SKIPPED]:
        table.add_row("", escape(example))
    if skipped > min(len(report.skipped_examples), SHOWN_SKIPPED):
        files = " ".join(report.files) or "FILE"
        table.add_row("", f"{skipped:,} rows skipped in all; `hone data check {escape(files)}` lists every one")
    for problem in report.problems:
        table.add_row("source not read", escape(problem))
    if report.truncated:
        table.add_row("truncated", str(report.truncated))
    if report.image_rows:
        table.add_row("rows with images", str(report.image_rows))
    table.add_row("tokens (trained)", f"{report.tokens:,} ({report.trained_tokens:,})")
    table.add_row("length min / median / p95 / max",
                  f"{report.length_min} / {report.length_median} / {report.length_p95} / {report.length_max}")
    for note in report.notes:
        table.add_row("note", escape(note))
    return table


class EventPrinter:
    """Consumes events and draws them; `last` keeps the final RunFinished / RunFailed."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress: Progress | None = None
        self.task = None
        self.last: events.Event | None = None
        self.first_step = 0
        self._last_plain = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop_progress()

    def _stop_progress(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def handle(self, event: events.Event) -> None:
        c = self.console
        if isinstance(event, events.DatasetReport):
            c.print(dataset_table(event))
        elif isinstance(event, events.Notice):
            style = "yellow" if event.level == "warning" else "dim"
            c.print(f"[{style}]{event.topic}: {event.message}[/{style}]")
        elif isinstance(event, events.RunStarted):
            c.print(f"[bold]{event.model}[/bold] on {event.device} ({event.dtype}), run folder {event.run_dir}")
            for path, choice in event.speed_paths.items():
                c.print(f"  {path}: {escape(speed_choice(event.device, choice))}")
            self.first_step = event.resumed_from_step
            if event.resumed_from_step:
                c.print(f"resumed from step {event.resumed_from_step}")
            if not c.is_terminal:
                return
            self.progress = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                     console=c, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("train", total=event.total_steps, completed=event.resumed_from_step,
                                               info="")
        elif isinstance(event, events.StepMetrics) and self.progress is None:
            now = time.monotonic()
            if event.step == self.first_step + 1 or event.step == event.total_steps \
                    or now - self._last_plain >= PLAIN_STEP_EVERY_S:
                self._last_plain = now
                c.print(step_line(event, self.first_step), highlight=False)
        elif isinstance(event, events.StepMetrics):
            info = f"loss {event.loss:.4f}  {event.tokens_per_s:,.0f} tok/s"
            if event.mem_allocated:
                info += f"  {event.mem_allocated / 2**30:.1f} GiB"
            self.progress.update(self.task, completed=event.step, info=info)
        elif isinstance(event, events.EvalMetrics):
            c.print(f"eval at step {event.step}: loss {event.loss:.4f}")
        elif isinstance(event, events.CheckpointSaved):
            c.print(f"[dim]checkpoint: {event.path}[/dim]")
        elif isinstance(event, events.RunFinished):
            self._stop_progress()
            word = "stopped" if event.stopped else "finished"
            c.print(f"[green]{word}[/green] after {event.step} steps in {event.elapsed:.0f} s, final loss "
                    f"{event.final_loss:.4f}; adapter: {event.adapter_dir}")
        elif isinstance(event, events.RunFailed):
            self._stop_progress()
            c.print(f"[red]failed:[/red] {event.reason}")
            if event.advice:
                c.print(f"advice: {event.advice}")
        if isinstance(event, (events.RunFinished, events.RunFailed)):
            self.last = event
