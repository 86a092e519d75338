"""Live progress on the terminal for `rehearse`, `run` and `watch`: notable events as lines plus a
panel, or with `--json` every event as one JSON line."""

from __future__ import annotations

import json
import time
from typing import TextIO

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape, render
from rich.table import Table
from rich.text import Text

from flare_diag.daemon.cli.waiting import waiting_words
from flare_diag.daemon.reports.report_view import FORECASTS, VERDICT_WORDS, grouped
from flare_diag.events.base import Event
from flare_diag.events.progress import WindowProgress
from flare_diag.events.stages import BEFORE_RESTORE
from flare_diag.events.window_fold import failed_checks
from flare_diag.events.schema import (
    AbortDecided, Alarm, CellRecorded, PhaseStarted, RestorationRecorded, TimeMarked, VerdictReached, WindowClosed,
)

STATUS_STYLE = {"measured": "green", "failed": "red", "invalid": "yellow", "deferred": "blue"}
BAR_WIDTH = 60


def bar(minute: float, stop_min: float, window_min: float, width: int = BAR_WIDTH) -> Text:
    """The window as a bar of `width` cells: elapsed minutes filled, a mark at the stop minute, the
    restore reservation after it shaded; the scale under it names minute 0, the stop and the end."""
    at = lambda m: max(0, min(width - 1, int(m / window_min * width)))  # noqa: E731
    done, stop = at(minute) if minute > 0 else -1, at(stop_min)
    t = Text()
    for i in range(width):
        if i == stop:
            t.append("┃", style="bold yellow")
        elif i <= done:
            t.append("━", style="red" if minute > stop_min else "green")
        else:
            t.append("─" if i < stop else "░", style="dim")
    t.append("┃", style="bold")
    scale = [" "] * (width + 1)
    for pos, label in ((0, "0"), (stop, f"{stop_min:g} stop"), (width - len(f"{window_min:g} end") + 1, f"{window_min:g} end")):
        for k, ch in enumerate(label):
            if 0 <= pos + k <= width:
                scale[pos + k] = ch
    t.append("\n" + "".join(scale), style="dim")
    return t


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


# A live view names a wait only once it has lasted this many window minutes: every request and read is
# a wait of a moment, and a line that changed with each would say nothing
SLOW_WAIT_MIN = 0.5


def slow_waits(p: WindowProgress) -> list[dict]:
    """The actions the window has waited on for SLOW_WAIT_MIN window minutes or more, the oldest first."""
    now = p.minute
    return [a for _aid, a in sorted(p.waiting.items())
            if now is not None and a["since_minute"] is not None and now - a["since_minute"] >= SLOW_WAIT_MIN]


def panel(p: WindowProgress, started_wall: float, now_wall: float) -> Group:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("window", f"{p.window_id} ({'rehearsal' if p.rehearsal else 'live'})")
    m = p.minute or 0.0
    if p.phase:
        total = p.phase_total
        done = f"{p.phase_requests}/{total}" if total else f"{p.phase_requests}"
        t.add_row("stage", f"{p.stage} — phase [bold]{p.phase}[/]: {done} requests")
    else:
        t.add_row("stage", p.stage)
    planned = p.requests_planned
    t.add_row("requests", f"{p.requests:,} of {planned:,} measured in the window" if planned
              else f"{p.requests:,} measured in the window")
    t.add_row("elapsed", f"window minute {m:.1f}; wall clock {_clock(now_wall - started_wall)}")
    wall = now_wall - started_wall
    # window seconds per wall second so far: where the two clocks differ (a paced or virtual rehearsal),
    # each ETA says its wall-clock time too, so that "in 5.0 min" at x20 is not read as five minutes
    rate = m * 60.0 / wall if wall >= 1.0 and m > 0 else None

    def within(minutes: float) -> str:
        minutes = max(0.0, minutes)
        said = f"in {minutes:.1f} min"
        if rate is not None and abs(rate - 1.0) > 0.05:
            said += f" (~{_clock(minutes * 60.0 / rate)} wall clock)"
        return said

    eta = []
    projected = p.phase_projected_end if p.phase else None
    if projected is not None:  # the phase's own pace so far, not the estimate it started with
        eta.append(f"phase end at minute {projected:.1f} by its pace so far ({within(projected - m)}; "
                   f"estimated {p.phase_estimated_end:.1f} at its start)" if p.phase_estimated_end is not None
                   else f"phase end at minute {projected:.1f} by its pace so far ({within(projected - m)})")
    elif p.phase and p.phase_estimated_end is not None:
        eta.append(f"phase end at minute {p.phase_estimated_end:.1f} ({within(p.phase_estimated_end - m)})")
    if p.stop_min is not None and p.stage in BEFORE_RESTORE:
        eta.append(f"stop minute {p.stop_min:g} {within(p.stop_min - m)}")
    if p.window_min is not None:
        eta.append(f"window end {within(p.window_min - m)}")
    if eta:
        t.add_row("ETA", "; ".join(eta))
    slow = slow_waits(p)
    if slow:
        t.add_row("waiting on", escape(waiting_words(slow, p.minute)))
    if p.abort:
        t.add_row("abort", f"[red]{p.abort['reason']}[/]: {p.abort['detail']}")
    if p.restoration_failed:
        t.add_row("restoration", f"[red]not verified[/]: {', '.join(p.restoration_failed)} failed")
    for a in p.alarms:
        t.add_row("alarm", f"[red]{a['kind']}[/]: {a['detail']}")
    if p.cells:
        t.add_row("cells", " ".join(f"[{STATUS_STYLE.get(s, 'white')}]{ph}:{s}[/]" for ph, s in ((ph, c["status"]) for ph, c in p.cells.items())))
    parts: list = [t]
    if p.window_min and p.stop_min is not None:
        parts.append(bar(m, p.stop_min, p.window_min))
    return Group(*parts)


def line_for(ev: Event, seen: WindowProgress | None = None) -> str | None:
    """The one-line form (rich markup) of an event worth a line of its own, or None (`seen`: the window's
    progress with this event applied, for the words that depend on what came before it)."""
    if isinstance(ev, PhaseStarted):
        return f"[dim]minute {ev.minute:6.1f}[/] phase [bold]{ev.phase}[/] (estimated end minute {ev.estimated_end_minute:.1f})"
    if isinstance(ev, CellRecorded):
        return f"  [{STATUS_STYLE.get(ev.status, 'white')}]{ev.status:>8}[/] {ev.phase}: {ev.reason}"
    if isinstance(ev, TimeMarked):
        return f"[dim]minute {ev.minute:6.1f}[/] {ev.mark}"
    if isinstance(ev, AbortDecided):
        return f"[red bold]ABORT[/] {ev.reason}: {ev.detail}"
    if isinstance(ev, Alarm):
        if ev.kind in FORECASTS:  # the window acts on it itself (it defers what will not fit): news, not an alarm
            return f"[yellow]forecast[/] {ev.kind}: {ev.detail}; the window defers what will not fit"
        return f"[red bold]ALARM[/] {ev.kind}: {ev.detail}"
    if isinstance(ev, RestorationRecorded):
        failed = failed_checks(ev.checks)
        if seen is not None and not seen.host_changed:  # nothing of the window's own to restore
            return ("no restoration needed: nothing on the host was changed; the host as found passes its checks"
                    if ev.verified else f"[red bold]nothing on the host was changed, but the host as found fails[/] "
                                        f"{', '.join(failed) or 'its checks'}")
        return ("restoration [green]verified[/]" if ev.verified
                else f"[red bold]restoration NOT verified[/]: {', '.join(failed) or 'see the report'} failed")
    if isinstance(ev, VerdictReached):
        words = VERDICT_WORDS.get(ev.hypothesis)
        return (f"verdict: [bold]{words}[/] ({ev.hypothesis}) — {grouped(ev.basis)}" if words
                else f"verdict: [bold]{ev.hypothesis}[/] — {grouped(ev.basis)}")
    if isinstance(ev, WindowClosed):
        return closed_line(ev, seen)
    return None


def closed_line(ev: WindowClosed, seen: WindowProgress | None) -> str:
    """The window's key line: its outcome and when, the abort that ended it, and what became of the host,
    so that the last line on the terminal says all an operator must act on."""
    when = f"at minute {ev.minute:.1f}" if ev.minute is not None else "before its t0 (at its preflight)"
    style = "green" if ev.outcome == "completed" else "red"
    parts = [f"window closed: [bold {style}]{ev.outcome}[/] {when}"]
    if seen is not None and seen.abort:
        parts.append(f"abort {seen.abort['reason']}: {seen.abort['detail']}")
    if seen is not None and seen.restoration is not None:
        parts.append(_restoration_words(seen))
    return "; ".join(parts)


def _restoration_words(seen: WindowProgress) -> str:
    verified = bool(seen.restoration and seen.restoration.get("verified"))
    if not seen.host_changed:
        return "nothing on the host changed" if verified else "[red bold]the host as found fails its checks[/]"
    if verified:
        return "restoration [green]verified[/]"
    return f"[red bold]restoration NOT verified[/] ({', '.join(seen.restoration_failed or []) or 'see the report'}): the primary needs a person"


def cell_group_line(status: str, reason: str, phases: list[str]) -> str:
    """Cells that ended alike (the cells an abort left unstarted, above all) as one line, not one each."""
    if len(phases) == 1:
        return f"  [{STATUS_STYLE.get(status, 'white')}]{status:>8}[/] {phases[0]}: {reason}"
    return (f"  [{STATUS_STYLE.get(status, 'white')}]{status:>8}[/] {len(phases)} cells: {reason}: "
            f"{', '.join(phases)}")


class LiveView:
    """Feeds events into a WindowProgress. For people: prints notable lines, and on a terminal a
    live panel. With `json_out`: one JSON line per event (seq, window, type, the event, and for a
    notable one its text and the progress), nothing else on that stream."""

    def __init__(self, console: Console, window_id: str = "", json_out: TextIO | None = None) -> None:
        self.console = console
        self.json_out = json_out
        self.progress = WindowProgress(window_id)
        self.started_wall = time.time()
        self.failed: Exception | None = None  # the first error in showing an event (the window went on)
        self._held: tuple[str, str, list[str]] | None = None  # cells that ended alike, not yet printed
        # get_renderable: the panel is rebuilt at each refresh, so the wall clock ticks between events
        self._live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._panel) \
            if console.is_terminal and json_out is None else None

    def _panel(self) -> Group:
        return panel(self.progress, self.started_wall, time.time())

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        except Exception as err:  # noqa: BLE001 - a terminal that went away
            self.failed = self.failed or err
        if self._live is not None:
            try:
                self._live.stop()
            except Exception as err:  # noqa: BLE001 - a terminal that went away
                self.failed = self.failed or err

    def on_event(self, seq: int, ev: Event, window_id: str | None = None) -> None:
        """Never raises: whatever goes wrong in showing an event is the display's, not the window's."""
        try:
            self._show(seq, ev, window_id)
        except Exception as exc:  # noqa: BLE001 - a display bug must not reach the store's writer
            self.failed = self.failed or exc

    def _show(self, seq: int, ev: Event, window_id: str | None = None) -> None:
        self.progress.apply(seq, ev)
        line = line_for(ev, self.progress)
        if self.json_out is not None:
            rec: dict = {"seq": seq, "window_id": self.progress.window_id if window_id is None else window_id,
                         "type": ev.__struct_config__.tag,
                         "event": msgspec.to_builtins(ev)}
            if line:
                rec["text"] = render(line).plain
                rec["progress"] = self.progress.as_dict()
            self.json_out.write(json.dumps(rec) + "\n")
            self.json_out.flush()
            return
        self._print(ev, line)

    def _print(self, ev: Event, line: str | None) -> None:
        """Prints a line, holding a cell's back while the next cells end alike (one line for them all)."""
        if isinstance(ev, CellRecorded):
            held = self._held
            if held is not None and held[0] == ev.status and held[1] == ev.reason:
                held[2].append(ev.phase)
                return
            self.flush()
            self._held = (ev.status, ev.reason, [ev.phase])
            return
        if line:
            self.flush()
            self.console.print(line)

    def flush(self) -> None:
        """Prints the cells held back, if any."""
        if self._held is not None:
            status, reason, phases = self._held
            self._held = None
            self.console.print(cell_group_line(status, reason, phases))
