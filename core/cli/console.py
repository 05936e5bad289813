"""Terminal rendering of run events, shared by `hone train` and `hone demo`: a progress bar for steps, tables
for dataset reports, one line for notices, checkpoints and evaluations; `Phase` for the work between them that
prints nothing of its own (a GGUF conversion, scoring, tokenizing), `convert_gguf_once` for the first load of a
GGUF model, and `quiet_library_noise` for every command that loads torch or transformers."""

from __future__ import annotations

import time
import warnings

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hone.core import events
from hone.core.api import guard_bitsandbytes_import, speed_choice, step_line
from hone.core.config import ModelConfig

# Without a terminal (nohup, CI, a log file) there is no progress bar: a plain step line at most this often, plus
# the first and last step.
PLAIN_STEP_EVERY_S = 30.0


def quiet_library_noise() -> None:
    """Silence library messages a `hone` user cannot act on (this process only; call before the libraries load).

    - bitsandbytes, on CPUs with AVX-512 BF16, fetches a CPU kernel from the Hub at import and warns when it cannot;
      Hone never runs 4-bit layers on the CPU, and imports it offline (hone.core.models.hub_kernels).
    - peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model, which warns on
      every run; nothing in the user's config causes it.
    """
    guard_bitsandbytes_import()
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


class Phase:
    """A stretch of work that prints nothing of its own, made visible: its text when it starts, how far it got
    (`update(done)`, e.g. rows scored so far) and "TEXT: done in N s" once when it ends without an error.

    On a terminal the count is a transient spinner line; elsewhere (a pipe, a log file) plain lines: the text, the
    count at most every PLAIN_STEP_EVERY_S seconds, then the done line with the final count.

    Use it as a context manager: `with Phase(console, "scoring 40 rows", total=40, unit="rows") as p: p.update(20)`.
    """

    def __init__(self, console: Console, text: str, total: int | None = None, unit: str = ""):
        self.console = console
        self.text = text
        self.total = total
        self.unit = unit
        self._progress: Progress | None = None
        self._task = None
        self._start = 0.0
        self._last_plain = 0.0
        self.done: int | None = None

    def __enter__(self) -> Phase:
        self._start = self._last_plain = time.monotonic()
        if self.console.is_terminal:
            count = "{task.completed:,.0f}" + ("/{task.total:,.0f}" if self.total else "") + f" {self.unit}"
            columns = [SpinnerColumn(), TextColumn(escape(self.text))]
            if self.unit:
                columns.append(TextColumn(count.strip()))
            self._progress = Progress(*columns, TimeElapsedColumn(), console=self.console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.text, total=self.total)
        else:
            self.console.print(f"{self.text} ...", highlight=False, soft_wrap=True)
        return self

    def update(self, done: int) -> None:
        """`done` units of the work are finished (a running count, not an increment)."""
        self.done = done
        if self._progress is not None:
            self._progress.update(self._task, completed=done)
            return
        now = time.monotonic()
        # The last count is on the done line.
        if now - self._last_plain >= PLAIN_STEP_EVERY_S and not (self.total and done >= self.total):
            self._last_plain = now
            of = f"/{self.total:,}" if self.total else ""
            self.console.print(f"  {done:,}{of} {self.unit}".rstrip(), highlight=False)

    def __exit__(self, exc_type, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if exc_type is None:
            count = f"{self.done:,} {self.unit}, " if self.done is not None and self.unit else ""
            self.console.print(
                f"{self.text}: {count}done in {time.monotonic() - self._start:.0f} s", highlight=False, soft_wrap=True
            )


def convert_gguf_once(model: ModelConfig, console: Console) -> None:
    """Convert a GGUF model (or the bundled one) to the safetensors copy every load reads, under a `Phase` line, if
    it was never converted; otherwise do nothing. The conversion takes a while and printed nothing before.

    Raises:
        ModelError: the model cannot be found or read (as loading it would).
    """
    from hone.core.api import gguf_conversion_folder, gguf_folder, pending_conversion, resolve_source

    source = resolve_source(model.name_or_path, model.gguf_file)  # a model that cannot be found raises here
    gguf = pending_conversion(model)
    if gguf is None:
        return
    with Phase(
        console,
        f"converting {source.name} from GGUF to safetensors (first use only; later loads read "
        f"{gguf_conversion_folder(gguf)})",
    ):
        gguf_folder(gguf)


# Skipped rows a run's data table lists by name; the count covers all, and `hone data check` lists every one.
SHOWN_SKIPPED = 5


def dataset_table(report: events.DatasetReport) -> Table:
    table = Table(
        title=f"{report.split} data ({report.format or 'auto'}): {', '.join(report.files)}",
        show_header=False,
        title_justify="left",
    )
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
    table.add_row(
        "length min / median / p95 / max",
        f"{report.length_min} / {report.length_median} / {report.length_p95} / {report.length_max}",
    )
    for note in report.notes:
        table.add_row("note", escape(note))
    return table


# Which EventPrinter method draws which event; the others (pause, resume) print nothing.
EVENT_HANDLERS: dict[type[events.Event], str] = {
    events.DatasetReport: "_on_dataset",
    events.Notice: "_on_notice",
    events.RunStarted: "_on_started",
    events.StepMetrics: "_on_step",
    events.EvalMetrics: "_on_eval",
    events.CheckpointSaved: "_on_checkpoint",
    events.RunFinished: "_on_finished",
    events.RunFailed: "_on_failed",
}


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
        handler = EVENT_HANDLERS.get(type(event))
        if handler is not None:
            getattr(self, handler)(event)

    def _on_dataset(self, event: events.DatasetReport) -> None:
        self.console.print(dataset_table(event))

    def _on_notice(self, event: events.Notice) -> None:
        style = "yellow" if event.level == "warning" else "dim"
        self.console.print(f"[{style}]{escape(event.topic)}: {escape(event.message)}[/{style}]")

    def _on_started(self, event: events.RunStarted) -> None:
        c = self.console
        where = f"{event.processes} processes ({event.device} each)" if event.processes > 1 else event.device
        c.print(
            f"[bold]{escape(event.model)}[/bold] on {escape(where)} ({event.dtype}), run folder {escape(event.run_dir)}"
        )
        for path, choice in event.speed_paths.items():
            c.print(f"  {path}: {escape(speed_choice(event.device, choice))}")
        self.first_step = event.resumed_from_step
        if event.resumed_from_step:
            c.print(f"resumed from step {event.resumed_from_step}")
        if not c.is_terminal:
            return
        self.progress = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=c,
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=event.total_steps, completed=event.resumed_from_step, info="")

    def _on_step(self, event: events.StepMetrics) -> None:
        if self.progress is None:
            self._plain_step(event)
        else:
            self._bar_step(event)

    def _plain_step(self, event: events.StepMetrics) -> None:
        """No terminal: a step line for the first and last step, and at most every PLAIN_STEP_EVERY_S between."""
        now = time.monotonic()
        if (
            event.step == self.first_step + 1
            or event.step == event.total_steps
            or now - self._last_plain >= PLAIN_STEP_EVERY_S
        ):
            self._last_plain = now
            self.console.print(step_line(event, self.first_step), highlight=False)

    def _bar_step(self, event: events.StepMetrics) -> None:
        info = f"loss {event.loss:.4f}  {event.tokens_per_s:,.0f} tok/s"
        if len(event.mem_by_gpu) > 1:
            info += "  " + " / ".join(f"{b / 2**30:.1f}" for b in event.mem_by_gpu) + " GiB"
        elif event.mem_allocated:
            info += f"  {event.mem_allocated / 2**30:.1f} GiB"
        if event.waiting_for_data:
            info += f"  waiting for data {event.waiting_for_data:.0%}"
        self.progress.update(self.task, completed=event.step, info=info)

    def _on_eval(self, event: events.EvalMetrics) -> None:
        self.console.print(f"eval at step {event.step}: loss {event.loss:.4f}")

    def _on_checkpoint(self, event: events.CheckpointSaved) -> None:
        self.console.print(f"[dim]checkpoint: {escape(event.path)}[/dim]")

    def _on_finished(self, event: events.RunFinished) -> None:
        self._stop_progress()
        word = "stopped" if event.stopped else "finished"
        self.console.print(
            f"[green]{word}[/green] after {event.step} steps in {event.elapsed:.0f} s, final loss "
            f"{event.final_loss:.4f}; adapter: {escape(event.adapter_dir)}"
        )
        self.last = event

    def _on_failed(self, event: events.RunFailed) -> None:
        self._stop_progress()
        if event.interrupted:  # the machine cut it off (a lost GPU): it goes on from its last checkpoint
            self.console.print(f"[yellow]interrupted:[/yellow] {escape(event.reason)}")
        else:
            self.console.print(f"[red]failed:[/red] {escape(event.reason)}")
        if event.advice:
            self.console.print(f"advice: {escape(event.advice)}")
        self.last = event
