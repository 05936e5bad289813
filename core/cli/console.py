"""Terminal rendering of run events, shared by `hone train` and `hone demo`: a progress bar for steps, tables
for dataset reports, one line for notices, checkpoints and evaluations."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hone.core import events


def dataset_table(report: events.DatasetReport) -> Table:
    table = Table(title=f"{report.split} data ({report.format or 'auto'}): {', '.join(report.files)}",
                  show_header=False, title_justify="left")
    table.add_row("rows read / kept", f"{report.rows_read} / {report.rows_kept}")
    for reason, count in report.skipped.items():
        table.add_row(f"skipped: {reason}", str(count))
    for example in report.skipped_examples[:5]:
        table.add_row("", example)
    if report.truncated:
        table.add_row("truncated", str(report.truncated))
    if report.image_rows:
        table.add_row("rows with images", str(report.image_rows))
    table.add_row("tokens (trained)", f"{report.tokens:,} ({report.trained_tokens:,})")
    table.add_row("length min / median / p95 / max",
                  f"{report.length_min} / {report.length_median} / {report.length_p95} / {report.length_max}")
    return table


class EventPrinter:
    """Consumes events and draws them; `last` keeps the final RunFinished / RunFailed."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress: Progress | None = None
        self.task = None
        self.last: events.Event | None = None

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
                c.print(f"  {path}: {choice}")
            self.progress = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                     console=c, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("train", total=event.total_steps, completed=event.resumed_from_step,
                                               info="")
        elif isinstance(event, events.StepMetrics) and self.progress is not None:
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
