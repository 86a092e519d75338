"""A rehearsal's injected faults: logged before the window opens, set on the simulated host (at once, or
as the window sends a phase's n-th request), and accounted for, fired or not, once the window closes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flare_diag.daemon.window.setup import InputError
from flare_diag.events.actions import SendRequest
from flare_diag.events.envelope import Envelope
from flare_diag.events.schema import ActionRequested, FaultsAccounted, FaultScheduled

if TYPE_CHECKING:
    from flare_diag.fixtures.flaresim.host import Fault, Host


class FaultSchedule:
    """The `--fault` specs of one rehearsal against one in-process simulated host."""

    def __init__(self, host: Host, faults: list[dict]) -> None:
        self.host = host
        self.faults = faults
        self._set: dict[int, Fault] = {}  # index in `faults` -> the host's Fault, once set

    def scheduled(self) -> list[FaultScheduled]:
        """The events that record every fault before the window opens."""
        return [FaultScheduled(spec=f["spec"], kind=f["kind"], at=f["at"], params=_params(f)) for f in self.faults]

    def set_unbound(self) -> None:
        """Sets every fault not bound to a phase's request on the host now (its moment counts from now)."""
        for i, f in enumerate(self.faults):
            if not _phase_bound(f):
                self._add(i, f["at"])

    def on_commit(self, envs: list[Envelope]) -> None:
        """A store listener: a fault bound to PHASE#N is set, bound to that request's body, as the window
        logs the request and before it is sent."""
        for env in envs:
            ev = env.event()
            if not (isinstance(ev, ActionRequested) and isinstance(ev.request, SendRequest)):
                continue
            req = ev.request
            for i, f in enumerate(self.faults):
                at = f["at"]
                if i not in self._set and _phase_bound(f) and at["phase"] == req.phase and at["request"] == req.order_index:
                    self._add(i, {"body_sha256": req.body_sha256})

    def accounted(self) -> FaultsAccounted:
        """Each fault and whether the host fired it (a phase-bound one that was never set did not fire)."""
        return FaultsAccounted(faults=[{"spec": f["spec"], "fired": i in self._set and self._set[i].fired}
                                       for i, f in enumerate(self.faults)])

    def _add(self, i: int, at: object) -> None:
        f = self.faults[i]
        try:
            self._set[i] = self.host.add_fault(f["kind"], at, _params(f))
        except ValueError as exc:
            raise InputError(f"--fault {f['spec']!r}: {exc}") from None


def _phase_bound(f: dict) -> bool:
    return isinstance(f["at"], dict) and "phase" in f["at"]


def _params(f: dict) -> dict:
    return {k: v for k, v in f.items() if k not in ("kind", "at", "spec")}
