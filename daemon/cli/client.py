"""The CLI side of the control socket: status, start, abort, watch and report against flare-diagd."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import msgspec

from flare_diag.daemon.service import control

if TYPE_CHECKING:  # rich and the event schema load when a reply is rendered, not to send a command
    from rich.console import Console

ENV_SOCKET = "FLARE_DIAG_SOCKET"


class DaemonUnreachable(RuntimeError):
    """No daemon answers on the socket: one line naming it."""


class Refused(RuntimeError):
    """The daemon answered with an error reply (`code`: "busy" when another window is running)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def socket_path(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    if os.environ.get(ENV_SOCKET):
        return Path(os.environ[ENV_SOCKET])
    from flare_diag.daemon.service.paths import default_socket
    return default_socket()


class Connection:
    def __init__(self, path: Path, timeout: float | None = 30.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.sock.close()
            raise DaemonUnreachable(f"{path}: no flare-diagd listening ({exc.strerror})") from None
        except PermissionError:
            self.sock.close()
            raise DaemonUnreachable(f"{path}: permission denied (the socket is for root and the daemon's group)") from None
        except OSError as exc:  # a path the kernel refuses (too long for a unix socket), not a socket, ...
            self.sock.close()
            why = (f"{len(str(path).encode())} bytes, longer than a unix socket's path may be (107)"
                   if "too long" in str(exc) else exc.strerror or str(exc))
            raise DaemonUnreachable(f"--socket {str(path)[:120]}: cannot connect ({why})") from None
        self.rfile = self.sock.makefile("rb")

    def send(self, cmd: control.Command) -> None:
        self.sock.sendall(control.encode_command(cmd))

    def line(self) -> dict:
        try:
            raw = self.rfile.readline(control.MAX_REPLY_LINE)
        except TimeoutError:
            raise DaemonUnreachable(f"{self.path}: the daemon did not answer within {self.sock.gettimeout():g} s") from None
        if not raw:
            raise DaemonUnreachable(f"{self.path}: the daemon closed the connection")
        return msgspec.json.decode(raw)

    def call(self, cmd: control.Command) -> dict:
        self.send(cmd)
        rep = self.line()
        if not rep.get("ok"):
            raise Refused(rep.get("error", "refused"), rep.get("code"))
        return rep

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def call(path: Path, cmd: control.Command) -> dict:
    """One command, its reply (Refused or DaemonUnreachable as any other call raises)."""
    c = Connection(path)
    try:
        return c.call(cmd)
    finally:
        c.close()


def status(path: Path, as_json: bool = False, out: TextIO | None = None) -> int:
    """The daemon's status: as JSON, or as aligned lines (plain text: a status call is the command run most
    often, and rich's table would be a third of its start-up; issue 49)."""
    c = Connection(path)
    try:
        rep = c.call(control.Status())
    finally:
        c.close()
    out = out or sys.stdout
    if as_json:
        out.write(msgspec.json.encode(rep).decode() + "\n")
        return 0
    rows = status_rows(rep)
    width = max(len(label) for label, _ in rows)
    out.write(f"flare-diagd ({rep['state']})\n" + "".join(f"  {label:<{width}}  {value}\n" for label, value in rows))
    return 0


def status_rows(rep: dict) -> list[tuple[str, str]]:
    """(label, value) lines of a status reply, the most urgent first."""
    rows = [("daemon pid", str(rep["pid"])), ("log", f"{rep['log']['path']} (head seq {rep['log']['head_seq']})")]
    if rep.get("needs_attention"):
        na = rep["needs_attention"]
        rows.insert(0, ("NEEDS ATTENTION", f"window {na['window_id']} is unfinished and not running: {na['needs']}"))
    for label, w in (("window", rep.get("window")), ("last window", rep.get("last_window"))):
        if w:
            rows += [(label, f"{w['window_id']} ({'rehearsal' if w['rehearsal'] else 'live'})"), *_window_rows(w)]
    return rows


def _window_rows(w: dict) -> list[tuple[str, str]]:
    done = f"{w['phase_requests']}/{w['phase_total']}" if w.get("phase_total") else str(w["phase_requests"])
    end, paced = w.get("phase_estimated_end_minute"), w.get("phase_projected_end_minute")
    said = (f"; phase ends at minute {paced:.1f} by its pace so far" if w["phase"] and paced is not None
            else f"; phase estimated to end at minute {end:.1f}" if w["phase"] and end is not None else "")
    rows = [("  stage", f"{w['stage']}" + (f", phase {w['phase']} ({done} requests)" if w["phase"] else "")),
            ("  minute", f"{w['minute']} (stop {w['stop_min']}, window end {w['window_min']}{said})"),
            ("  requests", str(w["requests"]))]
    if w.get("waiting"):
        from flare_diag.daemon.cli.waiting import waiting_words
        rows.append(("  waiting on", waiting_words(w["waiting"], w.get("minute"))))
    if w["abort"]:
        rows.append(("  abort", f"{w['abort']['reason']}: {w['abort']['detail']}"))
    if w.get("restoration_failed"):
        rows.append(("  restoration", f"not verified: {', '.join(w['restoration_failed'])} failed"))
    elif w.get("restoration_verified"):
        rows.append(("  restoration", "verified" if w.get("host_changed", True) else
                     "none needed: nothing on the host was changed, and the host as found passes its checks"))
    rows += [("  alarm", f"{a['kind']}: {a['detail']}") for a in w.get("alarms") or []]
    if w["outcome"]:
        rows.append(("  outcome", f"{w['outcome']} (verdict {w['verdict']})"))
    return rows


# What an operator sees while the daemon answers a start: its checks take seconds idle and minutes on a
# busy machine, and a silent terminal reads as a hung one. The daemon goes on if the caller stops waiting.
START_WAIT = ("the daemon is checking the site (read-only), rehearsing new plan bytes offline and forecasting; "
              "nothing on the host changes before it answers. Ctrl-C stops waiting, not the start: `flare-diag status`")


@contextlib.contextmanager
def _waiting(console: Console, what: str) -> Iterator[None]:
    """A spinner with `what` while the caller waits, on a terminal only; it is gone when the answer comes, so
    a refusal is still one line (and a script's stderr holds only what went wrong)."""
    if not console.is_terminal:
        yield
        return
    with console.status(what):
        yield


def start(path: Path, plan_toml: bytes, plan_label: str, site: str, time_scale: float, console: Console,
          calibration: dict | None = None, accept_partial: bool = False, caller_fixtures: dict | None = None) -> int:
    """The plan (and any calibration) go as content the caller read; the site is a name the daemon's
    operator installed. No deadline on the answer: the daemon answers once its read-only checks are done
    (the site check, starting a local engine's incumbent, the offline harness's rehearsal, the forecast),
    which takes minutes on a busy machine; Ctrl-C gives up waiting."""
    c = Connection(path, timeout=None)
    try:
        with _waiting(console, START_WAIT):
            rep = c.call(control.Start(plan_toml=plan_toml.decode("utf-8", "replace"), plan_label=plan_label, site=site,
                                       time_scale=time_scale, calibration=calibration or {}, accept_partial=accept_partial,
                                       caller_fixtures=caller_fixtures or {}))
    finally:
        c.close()
    console.print(f"started window {rep['window_id']}" + (" (rehearsal)" if rep.get("rehearsal") else ""))
    print(rep["window_id"])
    return 0


def abort(path: Path, reason: str, console: Console) -> int:
    c = Connection(path)
    try:
        rep = c.call(control.Abort(reason=reason))
    finally:
        c.close()
    console.print(f"abort requested for window {rep['window_id']}; it restores the incumbent before it closes")
    return 0


def watch(path: Path, from_seq: int | None, console: Console, json_out: TextIO | None = None) -> int:
    """Streams the current window's events until it closes (as JSON lines on `json_out` when given);
    exits as `run` does (contract section 3)."""
    c = Connection(path, timeout=None)
    try:
        c.call(control.Watch(from_seq=from_seq))
        from flare_diag.daemon.cli.live import LiveView  # the live view's imports only where it is shown
        from flare_diag.events.base import decode_payload
        from flare_diag.events.schema import WindowClosed
        view = LiveView(console, json_out=json_out)
        with view:
            while True:
                rep = c.line()
                if rep.get("watching") is False:  # no window is running (any backlog's close came first)
                    return _nothing_to_watch(console, rep)
                if "seq" not in rep:
                    raise Refused(rep.get("error", "watch ended"))
                ev = decode_payload(rep["type"], rep["schema_v"], msgspec.json.encode(rep["event"]))
                if view.progress.window_id and rep["window_id"] not in ("", view.progress.window_id):
                    continue
                view.on_event(rep["seq"], ev, rep["window_id"])
                if isinstance(ev, WindowClosed):
                    return exit_for(ev.outcome)
    finally:
        c.close()


def _nothing_to_watch(console: Console, rep: dict) -> int:
    """No window is running: the last one's outcome and exit code, or 0 when none has run."""
    if not rep.get("window_id"):
        console.print("no window is running, and none has run on this daemon")
        return 0
    console.print(f"no window is running; the last, {rep['window_id']}, closed {rep.get('outcome') or 'without an outcome'}")
    return exit_for(rep.get("outcome"))


def report(path: Path, window_id: str, fmt: str, out: Path | None) -> int:
    c = Connection(path, timeout=300)
    try:
        rep = c.call(control.Report(window_id=window_id, format=fmt))  # type: ignore[arg-type]  # fmt is one of the formats the parser allows
    finally:
        c.close()
    if out is None:
        sys.stdout.write(rep["content"])
    else:
        out.write_text(rep["content"])
    return 0


def exit_for(outcome: str | None) -> int:
    """Contract section 3: 0 completed and restored; 1 partial or aborted, restored; 3 the restoration
    did not verify (the primary needs a person)."""
    return {"completed": 0, "restore_failed": 3}.get(outcome or "", 1)
