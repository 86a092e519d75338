"""The restore's reads of a host still settling after the load: asked again within a bound before they count."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from flare_diag.events.answers import MonitoringView, RouterView, read
from flare_diag.events.schema import NS_PER_MIN, NS_PER_S, Alarm
from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Sleep
from flare_diag.policies.scaling import effective_s

# Every bound here is given at least this much real time under a scaled clock (a simulated site only)
SETTLE_MIN_REAL_S = 5.0

# A read that failed in a way that may pass when asked again: a connection lost or refused, a 502 or 503 (an
# engine or a proxy still coming up after the load). Asked again 3 times within 30 s. Not one that got no answer
# within its deadline: asking a host that held a read for a whole deadline again would spend the restore's budget
# on a hung host, whose restore fails either way.
PASSING_ERRORS = ("transport", "http_502", "http_503")
READ_AGAIN_S, READ_AGAIN_TRIES = 30.0, 3

# Monitoring shows a target that came back only at its next scrape (Prometheus scrapes every minute by default):
# its first read after a load can still hold the scrape that failed while the engine was down. 12 reads in 120 s.
MONITORING_SETTLE_S, MONITORING_READS = 120.0, 12

# A router may answer a readmit before it applies it (a configuration pushed to its proxies): its view is read
# again for 30 s before the readmission is called not verified.
READMIT_SETTLE_S, READMIT_READS = 30.0, 6


def _until(w: WindowCore, bound_s: float) -> int:
    """`bound_s` from now (never less than SETTLE_MIN_REAL_S of real time), cut to the restore's budget and the
    window's end."""
    end = w.now + int(effective_s(bound_s, SETTLE_MIN_REAL_S, w.time_scale) * NS_PER_S)
    if w.state.restore_end_ns is not None:
        end = min(end, w.state.restore_end_ns)
    if w.state.t0 is not None:
        end = min(end, w.state.t0 + int(w.plan.timing.window_min * NS_PER_MIN))
    return end


def read_until(w: WindowCore, action: str, args: dict[str, Any], res: Any, done: Callable[[Any], bool],
               bound_s: float, reads: int) -> Generator[Any, Any, Any]:
    """`res`, a read of the restore, asked again every bound/reads until `done` says of an answer that it settles
    the read, or the bound passes (never past the restore's budget or the window's end): the last answer."""
    step = int(effective_s(bound_s, SETTLE_MIN_REAL_S, w.time_scale) / reads * NS_PER_S)
    end = _until(w, bound_s)
    while not done(res) and w.now + step <= end:
        yield Sleep(w.now + step)
        res = yield from w.act(action, args)
    return res


def pause(w: WindowCore, wait_s: float) -> Generator[Any, Any, None]:
    """A wait of `wait_s` (never less than SETTLE_MIN_REAL_S of real time), cut to the restore's budget."""
    until = _until(w, wait_s)
    if until > w.now:
        yield Sleep(until)


def _answered(res: Any) -> bool:
    return bool(res.ok) or res.error not in PASSING_ERRORS


def read_again(w: WindowCore, action: str, args: dict[str, Any], res: Any) -> Generator[Any, Any, Any]:
    """`res`, or where it failed in a way that may pass (PASSING_ERRORS), the same read asked again until one
    answers: one answer the host would have given a moment later does not fail the restore and leave the
    primary out of rotation."""
    return (yield from read_until(w, action, args, res, _answered, READ_AGAIN_S, READ_AGAIN_TRIES))


def read_identity(w: WindowCore) -> Generator[Any, Any, Any]:
    """The incumbent's identity, read (again, where the read failed in a way that may pass)."""
    ident = yield from w.act("read_identity", {})
    return (yield from read_again(w, "read_identity", {}, ident))


def _healthy(mon: Any) -> bool:
    t = read(MonitoringView, mon).target if mon.ok else None
    return t is not None and bool(t.registered) and bool(t.healthy)


def monitoring_settled(w: WindowCore) -> Generator[Any, Any, bool]:
    """Monitoring read until it shows the incumbent registered and healthy, within MONITORING_SETTLE_S: True once it
    does; else an alarm saying what it showed last, and False. Asked only after a first read that did not show it,
    and after the readmission, which does not wait for it."""
    mon = yield from w.act("snapshot", {"what": "monitoring"})
    mon = yield from read_until(w, "snapshot", {"what": "monitoring"}, mon, _healthy, MONITORING_SETTLE_S, MONITORING_READS)
    if _healthy(mon):
        return True
    t = read(MonitoringView, mon).target if mon.ok else None
    last = (f"it could not be read ({mon.detail or mon.error})" if not mon.ok else "no such target" if t is None
            else f"target {t.id} registered {t.registered}, healthy {t.healthy}")
    bound_s = effective_s(MONITORING_SETTLE_S, SETTLE_MIN_REAL_S, w.time_scale)
    w.emit(Alarm(kind="monitoring_not_healthy", detail=f"monitoring did not show the incumbent registered and healthy "
                                                       f"within {bound_s:g} s of the restore: {last}"))
    return False


def _admitted_or_refused(view: Any) -> bool:
    return read(RouterView, view).backend.admitted is True if view.ok else view.error not in PASSING_ERRORS


def admitted_settled(w: WindowCore, view: Any) -> Generator[Any, Any, Any]:
    """The router's view after a readmit, read again within READMIT_SETTLE_S while it does not show the backend
    admitted yet (or failed in a way that may pass): the last view."""
    return (yield from read_until(w, "snapshot", {"what": "router"}, view, _admitted_or_refused,
                                  READMIT_SETTLE_S, READMIT_READS))
