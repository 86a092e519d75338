"""Live progress on the terminal for `rehearse` and `watch`: notable events as lines, plus a panel."""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from events.base import Event
from events.progress import WindowProgress
from events.window_fold import failed_checks
from events.schema import (
    AbortDecided, Alarm, CellRecorded, PhaseStarted, RestorationRecorded, TimeMarked, VerdictReached, WindowClosed,
)

STATUS_STYLE = {"measured": "green", "failed": "red", "invalid": "yellow", "deferred": "blue"}


def panel(p: WindowProgress) -> Group:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("window", f"{p.window_id} ({'rehearsal' if p.rehearsal else 'live'})")
    t.add_row("stage", p.stage + (f" — phase [bold]{p.phase}[/], {p.phase_requests} requests" if p.phase else ""))
    t.add_row("requests", str(p.requests))
    m = p.minute or 0.0
    lines = f"stop {p.stop_min:g}, window end {p.window_min:g}" if p.stop_min and p.window_min else ""
    t.add_row("minute", f"{m:.1f}  ({lines})")
    if p.abort:
        t.add_row("abort", f"[red]{p.abort['reason']}[/]: {p.abort['detail']}")
    if p.restoration_failed:
        t.add_row("restoration", f"[red]not verified[/]: {', '.join(p.restoration_failed)} failed")
    for a in p.alarms:
        t.add_row("alarm", f"[red]{a['kind']}[/]: {a['detail']}")
    if p.cells:
        t.add_row("cells", " ".join(f"[{STATUS_STYLE.get(s, 'white')}]{ph}:{s}[/]" for ph, s in ((ph, c["status"]) for ph, c in p.cells.items())))
    parts: list = [t]
    if p.window_min:
        parts.append(ProgressBar(total=p.window_min, completed=min(m, p.window_min), width=60,
                                 complete_style="red" if p.stop_min and m > p.stop_min else "green"))
    return Group(*parts)


def line_for(ev: Event) -> str | None:
    """The one-line form of an event worth a line of its own, or None."""
    if isinstance(ev, PhaseStarted):
        return f"[dim]minute {ev.minute:6.1f}[/] phase [bold]{ev.phase}[/] (estimated end minute {ev.estimated_end_minute:.1f})"
    if isinstance(ev, CellRecorded):
        return f"  [{STATUS_STYLE.get(ev.status, 'white')}]{ev.status:>8}[/] {ev.phase}: {ev.reason}"
    if isinstance(ev, TimeMarked):
        return f"[dim]minute {ev.minute:6.1f}[/] {ev.mark}"
    if isinstance(ev, AbortDecided):
        return f"[red bold]ABORT[/] {ev.reason}: {ev.detail}"
    if isinstance(ev, Alarm):
        return f"[red bold]ALARM[/] {ev.kind}: {ev.detail}"
    if isinstance(ev, RestorationRecorded):
        failed = failed_checks(ev.checks)
        return ("restoration [green]verified[/]" if ev.verified
                else f"[red bold]restoration NOT verified[/]: {', '.join(failed) or 'see the report'} failed")
    if isinstance(ev, VerdictReached):
        return f"verdict: [bold]{ev.hypothesis}[/] — {ev.basis}"
    if isinstance(ev, WindowClosed):
        return f"window closed: [bold]{ev.outcome}[/] at minute {ev.minute}"
    return None


class LiveView:
    """Feeds events into a WindowProgress; prints notable lines; on a terminal also a live panel."""

    def __init__(self, console: Console, window_id: str = "") -> None:
        self.console = console
        self.progress = WindowProgress(window_id)
        self._live = Live(panel(self.progress), console=console, refresh_per_second=4, transient=True) \
            if console.is_terminal else None

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def on_event(self, seq: int, ev: Event) -> None:
        self.progress.apply(seq, ev)
        line = line_for(ev)
        if line:
            self.console.print(line)
        if self._live is not None:
            self._live.update(panel(self.progress))
