"""The window state machine: the seed's execution contract as a pure, replayable decider.

`WindowPolicy.receive(input) -> decisions` is the whole interface (the sans-I/O shape of h11):
the runner appends each input to the log, feeds it here, appends the decisions, and carries
them out. Time is only what inputs carry (`at_ns`, the window clock). The procedure is written
as generators that yield what they wait for (action outcomes, a time, a quiet target); the
machine resumes them when an input satisfies the wait, and replaces the experimental procedure
with the restore procedure on an abort or at the stop minute.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from events.schema import (
    ActionDone, ActionRequested, AbortDecided, Alarm, CancelRequested, CellRecorded, DaemonRestarted,
    Decision, DrainObserved, Input, OperatorAbort, PhaseStarted, RequestDone, RequestMeasured, RestorationRecorded,
    RestoreStarted, Tick, TimeMarked, TraceOrderFrozen, VerdictReached, WatchObserved, WindowClosed, WindowOpened,
)
from policies import rules
from policies.interpret import findings, verdict
from policies.plan import Plan, PhaseSpec, expand_phases, expected_identity, plan_from_builtins, trace_arm_order

NS_PER_MIN = 60_000_000_000
NS_PER_S = 1_000_000_000


class _Act:
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class _Sleep:
    __slots__ = ("until_ns",)

    def __init__(self, until_ns: int) -> None:
        self.until_ns = until_ns


class _Quiet:
    """Wait until no action is outstanding."""


class _Interrupt(Exception):
    def __init__(self, cause: str) -> None:
        self.cause = cause


Proc = Generator[Any, Any, None]


class WindowPolicy:
    """One window's decisions. Deterministic: the same inputs always give the same decisions."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.window_id = ""
        self.stage = "idle"  # idle | experiment | restore | closed
        self.now = 0
        self.t0: int | None = None
        self.next_id = 1
        self.pending: dict[int, tuple[str, bool]] = {}  # id -> (action, experimental)
        self.results: dict[int, Input] = {}
        self.wait: object = None
        self.gen: Proc | None = None
        self.cells: dict[str, dict] = {}
        self.phase_order: list[str] = []
        self.required: list[str] = []  # cells without which the window is `partial` (contract 4)
        self.draining_after = False  # the current phase's requests all finished; its closing drain runs
        self.comparable: dict[str, bool] = {}
        self.current: dict | None = None  # the phase being run: id, done, total
        self.abort: dict | None = None
        self.restore_cause: str | None = None
        self.restore_started: float | None = None
        self.incumbent: dict | None = None
        self.snapshots: dict[str, dict | None] = {}
        self.quiesced = False
        self.candidate_loaded: str | None = None  # incarnation label loaded by the window
        self.candidate_id: str | None = None
        self.candidate_recipe = ""
        self.candidate_sha: str | None = None
        self.failed_incarnations: dict[str, str] = {}
        self.unverified_incarnations: dict[str, str] = {}
        self.ref_labels: dict | None = None
        self.last_counters: dict | None = None
        self.estimates: dict[str, tuple[float, int]] = {}  # fixture -> (sum_ns, n)
        self.sent_at: dict[int, int] = {}
        self.fixtures: dict[str, dict] = {}
        self.stop_marked = False
        self.overrun_marked = False
        self._out: list[Decision] = []

    # --- the interface -----------------------------------------------------------------------

    def receive(self, inp: Input) -> list[Decision]:
        self._out = out = []
        if self.stage == "closed":
            return out
        self.now = max(self.now, inp.at_ns)
        if isinstance(inp, WindowOpened):
            if self.stage == "idle":
                self._open(inp)
        elif self.stage == "idle":
            return out
        elif isinstance(inp, (ActionDone, RequestDone)):
            self._outcome(inp)
        elif isinstance(inp, WatchObserved):
            self._watch(inp)
        elif isinstance(inp, OperatorAbort):
            self._abort_from_outside("operator", inp.reason or "operator abort")
        elif isinstance(inp, DaemonRestarted):
            for aid in sorted(self.pending):
                self.results[aid] = ActionDone(at_ns=inp.at_ns, action_id=aid, ok=False, error="lost_in_restart",
                                               detail="the daemon restarted before its outcome was recorded; possibly done")
                self.pending.pop(aid)
            self._abort_from_outside("daemon_restart", "the daemon restarted inside the window")
        elif not isinstance(inp, Tick):
            return out
        self._check_time()
        self._advance()
        return out

    def next_wakeup_ns(self) -> int | None:
        """The earliest window time at which a Tick may change something, or None."""
        if self.stage in ("idle", "closed"):
            return None
        times = []
        if isinstance(self.wait, _Sleep):
            times.append(self.wait.until_ns)
        if self.t0 is not None:
            if self.stage == "experiment" and not self.stop_marked:
                times.append(self._stop_ns())
            elif not self.overrun_marked:
                times.append(self.t0 + int(self.plan.timing.window_min * NS_PER_MIN))  # type: ignore[union-attr]
        return min(times) if times else None

    @property
    def closed(self) -> bool:
        return self.stage == "closed"

    # --- plumbing ----------------------------------------------------------------------------

    def _emit(self, d: Decision) -> None:
        self._out.append(d)

    def _minute(self, ns: int | None = None) -> float | None:
        if self.t0 is None:
            return None
        return round(((self.now if ns is None else ns) - self.t0) / NS_PER_MIN, 4)

    def _stop_ns(self) -> int:
        return self.t0 + int(self.plan.timing.stop_min * NS_PER_MIN)  # type: ignore[operator,union-attr]

    def _open(self, inp: WindowOpened) -> None:
        self.plan = plan_from_builtins(inp.plan, "window plan")
        self.window_id = inp.window_id
        self.candidate_recipe = inp.candidate_recipe
        specs = expand_phases(self.plan)
        self.phase_order = [p.id for p in specs] + [c.id for c in self.plan.conditional]
        self.comparable = {p.id: p.comparable for p in specs}
        self.required = [p.id for p in specs if not p.optional]
        self.stage = "experiment"
        self.gen = self._experiment()
        self.wait = None
        self._resume(None)

    def _outcome(self, inp: ActionDone | RequestDone) -> None:
        if inp.action_id not in self.pending:
            return  # an outcome nobody waits for (already cancelled or unknown) changes nothing
        self.pending.pop(inp.action_id)
        self.results[inp.action_id] = inp
        if self.stage != "experiment":
            return
        reason = rules.abort_for_error(inp.error)
        if reason:
            self._abort_from_outside(reason, f"{'request' if isinstance(inp, RequestDone) else 'action'} "
                                             f"{inp.action_id}: {inp.detail or inp.error}")
            return
        if isinstance(inp, ActionDone) and inp.ok:
            self._check_observation(inp.data)

    def _check_observation(self, data: dict) -> None:
        labels = data.get("labels")
        if self.ref_labels and isinstance(labels, dict):
            drift = rules.label_drift(self.ref_labels, labels)
            if drift:
                self._abort_from_outside("identity_drift", "metrics identity changed: " + "; ".join(drift))
                return
        gauges = data.get("gauges")
        if isinstance(gauges, dict) and self.quiesced:
            breach = rules.growth_breach(gauges, self._bounds(), self.plan.identity.host_cache_bytes)  # type: ignore[union-attr]
            if breach:
                self._abort_from_outside("uncontrolled_growth", breach)

    def _bounds(self) -> dict:
        g = self.plan.growth  # type: ignore[union-attr]
        return {"max_resident_bytes": g.max_resident_bytes, "max_host_cache_records": g.max_host_cache_records}

    def _watch(self, inp: WatchObserved) -> None:
        if self.stage != "experiment":
            return
        d = inp.data
        if inp.source == "gpu":
            xids = d.get("xid_events") or []
            if xids:
                x = xids[0]
                self._abort_from_outside("gpu_fault", f"Xid {x.get('xid')} on GPU {x.get('gpu')}")
                return
            breach = rules.gpu_memory_breach(d.get("gpus") or [], self.plan.growth.max_gpu_memory_fraction)  # type: ignore[union-attr]
            if breach:
                self._abort_from_outside("uncontrolled_growth", breach)
        elif inp.source == "router" and self.quiesced:
            snap = self.snapshots.get("router") or {}
            backend = d.get("backend") or {}
            if snap.get("config_sha256") and d.get("config_sha256") not in (None, snap["config_sha256"]):
                self._abort_from_outside("containment", "router configuration changed during the window")
            elif backend.get("admitted") or backend.get("inflight"):
                self._abort_from_outside("containment", f"quiesced backend {backend.get('id')} is receiving traffic"
                                                        f" (admitted={backend.get('admitted')}, inflight={backend.get('inflight')})")

    def _check_time(self) -> None:
        if self.t0 is None or self.plan is None:
            return
        if self.stage == "experiment" and self.now >= self._stop_ns():
            self._mark_stop()
            # a phase whose requests have all finished is judged on them: its closing drain (bounded
            # by the drain timeout, no experimental request in it) runs on, then the window restores
            if not self.draining_after:
                self._interrupt_outside("stop_minute")
        end = self.t0 + int(self.plan.timing.window_min * NS_PER_MIN)
        if self.stage == "restore" and self.now >= end and not self.overrun_marked:
            self.overrun_marked = True
            self._emit(TimeMarked(mark="window_end", minute=self._minute(end)))  # type: ignore[arg-type]
            self._emit(Alarm(kind="restore_overrun",
                             detail=f"restore still running at minute {self._minute()}, past the window end"))

    def _mark_stop(self) -> None:
        if not self.stop_marked:
            self.stop_marked = True
            self._emit(TimeMarked(mark="stop", minute=self._minute(self._stop_ns())))  # type: ignore[arg-type]

    def _abort_from_outside(self, reason: str, detail: str) -> None:
        if self.stage != "experiment":
            return
        self._record_abort(reason, detail)
        self._interrupt_outside("abort")

    def _record_abort(self, reason: str, detail: str) -> None:
        self.abort = {"reason": reason, "detail": detail, "minute": self._minute()}
        self._emit(AbortDecided(reason=reason, detail=detail, minute=self._minute()))

    def _interrupt_outside(self, cause: str) -> None:
        if self.gen is not None:
            self.gen.close()
        self._begin_restore(cause)

    def _begin_restore(self, cause: str) -> None:
        self.stage = "restore"
        self.restore_cause = cause
        self._close_open_cells(cause)
        exp = sorted(a for a, (_n, e) in self.pending.items() if e)
        if exp:
            self._emit(CancelRequested(action_ids=exp, reason=cause))
        self.restore_started = self._minute()
        self._emit(RestoreStarted(cause=cause, minute=self.restore_started))
        self.gen = self._restore()
        self.wait = None
        self._resume(None)

    def _advance(self) -> None:
        while self.gen is not None:
            w = self.wait
            if isinstance(w, _Act):
                if any(i not in self.results for i in w.ids):
                    return
                val = [self.results.pop(i) for i in w.ids]
            elif isinstance(w, _Sleep):
                if self.now < w.until_ns:
                    return
                val = None
            elif isinstance(w, _Quiet):
                if self.pending:
                    return
                val = None
            else:
                return
            self._resume(val)

    def _resume(self, val: Any) -> None:
        gen = self.gen
        try:
            self.wait = gen.send(val)  # type: ignore[union-attr]
        except StopIteration:
            self.wait = None
            self.gen = None
            if self.stage == "experiment":
                self._begin_restore("completed")
            else:
                self.stage = "closed"
        except _Interrupt as it:
            self.gen = None
            self.wait = None
            self._begin_restore(it.cause)

    def _request(self, action: str, args: dict | None = None, experimental: bool = False) -> int:
        aid = self.next_id
        self.next_id += 1
        self.pending[aid] = (action, experimental)
        self._emit(ActionRequested(action_id=aid, action=action, args=args or {}, experimental=experimental))
        return aid

    def _act(self, action: str, args: dict | None = None, experimental: bool = False) -> Generator[Any, Any, Any]:
        aid = self._request(action, args, experimental)
        res = yield _Act([aid])
        return res[0]

    def _act_all(self, calls: list[tuple[str, dict]], experimental: bool = False) -> Generator[Any, Any, Any]:
        ids = [self._request(a, args, experimental) for a, args in calls]
        return (yield _Act(ids))

    def _abort_inside(self, reason: str, detail: str) -> None:
        self._record_abort(reason, detail)
        raise _Interrupt("abort")

    def _fail_inside(self, res: ActionDone, what: str) -> None:
        """A failed action before anything was changed: abort with its class, else as a preflight failure."""
        self._abort_inside(rules.abort_for_error(res.error) or "preflight", f"{what}: {res.detail or res.error}")

    # --- cells -------------------------------------------------------------------------------

    def _cell(self, phase: str, status: str, reason: str, **kw: Any) -> None:
        if phase in self.cells:
            return
        cell = {"phase": phase, "status": status, "reason": reason, **kw}
        self.cells[phase] = cell
        self._emit(CellRecorded(phase=phase, status=status, reason=reason, **kw))

    def _close_open_cells(self, cause: str) -> None:
        if self.current is not None:
            c = self.current
            why = (f"cut at the stop minute after {c['done']} of {c['total']} requests" if cause == "stop_minute"
                   else f"window aborted ({self.abort['reason'] if self.abort else cause}) after {c['done']} of {c['total']} requests")
            self._cell(c["id"], "invalid", why, requests=c["done"], comparable=c["comparable"])
            self.current = None
        if cause == "completed":
            why = "not started"
        elif cause == "stop_minute":
            why = "not started: the stop minute was reached"
        else:
            why = f"not started: window aborted ({self.abort['reason'] if self.abort else cause})"
        conditional = {c.id: c.admission for c in self.plan.conditional} if self.plan else {}
        for pid in self.phase_order:
            if pid in conditional:
                self._cell(pid, "deferred", f"later conditional stage, {conditional[pid]}", comparable=False)
            elif pid not in self.cells:
                self._cell(pid, "deferred", why, comparable=self.comparable.get(pid, True))

    # --- the experimental procedure ---------------------------------------------------------

    def _experiment(self) -> Proc:
        plan = self.plan
        assert plan is not None
        res = yield from self._act("validate_fixtures", {"fixtures": [f.name for f in plan.fixtures]})
        if not res.ok:
            self._fail_inside(res, "fixture validation failed")
        self.fixtures = res.data.get("fixtures", {})
        if plan.trace is not None:
            self._emit(TraceOrderFrozen(order=[pid for pid, *_ in trace_arm_order(plan.trace)]))
        what = ("incumbent", "router", "monitoring", "gpu", "configuration")
        snaps = yield from self._act_all([("snapshot", {"what": w}) for w in what])
        for w, r in zip(what, snaps):
            if r.ok:
                self.snapshots[w] = r.data
            elif r.error == "not_applicable":
                self.snapshots[w] = None
            else:
                self._fail_inside(r, f"{w} snapshot failed")
        inc = self.snapshots["incumbent"] or {}
        self.incumbent = {"recipe": inc.get("recipe"), "sha256": inc.get("sha256"), "identity": inc.get("identity", {})}
        expected = expected_identity(plan)
        mism = rules.identity_mismatches(expected, inc.get("identity", {}))
        if inc.get("identity", {}).get("recipe_sha256") not in (None, inc.get("sha256")):
            mism.append("incumbent serving recipe_sha256 differs from the manager's loaded recipe")
        if mism:
            self._abort_inside("identity_drift", "incumbent identity before take-down: " + "; ".join(mism))
        # The seed: retain exact recipe bytes before taking the incumbent down. Every load, unload
        # and the restore from here on name the hash of the bytes retained here (contract section 1
        # gives no other source of a recipe's hash).
        kept = yield from self._act_all([
            ("retain_recipe", {"recipe": inc.get("recipe"), "expect_sha256": inc.get("sha256"), "role": "incumbent"}),
            ("retain_recipe", {"recipe": self.candidate_recipe, "role": "candidate"}),
        ])
        for role, r in zip(("incumbent", "candidate"), kept):
            if not r.ok:
                self._fail_inside(r, f"{role} recipe bytes could not be retained")
        self.candidate_sha = kept[1].data.get("sha256")
        # Rollback is previewed too: the incumbent's own load is what the restore will ask for.
        previews = yield from self._act_all([
            ("preview", {"op": "unload", "recipe": inc.get("recipe"), "sha256": inc.get("sha256"), "role": "incumbent"}),
            ("preview", {"op": "load", "recipe": self.candidate_recipe, "sha256": self.candidate_sha, "role": "candidate"}),
            ("preview", {"op": "load", "recipe": inc.get("recipe"), "sha256": inc.get("sha256"), "role": "rollback"}),
        ])
        for r in previews:
            if not r.ok or r.data.get("ok") is not True:
                self._fail_inside(r, "preview refused")
        res = yield from self._act("quiesce", {})
        if not res.ok and res.error != "not_applicable":
            self._fail_inside(res, "quiesce failed")
        self.quiesced = True
        self.t0 = self.now
        self._emit(TimeMarked(mark="t0", minute=0.0))
        drained = yield from self._drain(plan.timing.quiesce_drain_timeout_s, "quiesce",
                                         router=self.snapshots.get("router") is not None)
        if not drained:
            self._abort_inside("containment", f"the primary did not drain within {plan.timing.quiesce_drain_timeout_s} s of quiesce")
        res = yield from self._act("unload", {"recipe": inc.get("recipe"), "sha256": inc.get("sha256")})
        if not res.ok:
            # the take-down itself failed: no candidate can load beside the incumbent, so restore
            self._abort_inside(rules.abort_for_error(res.error) or "preflight",
                               f"incumbent unload failed, nothing was taken down: {res.detail or res.error}")
        for ph in expand_phases(plan):
            if self.now >= self._stop_ns():  # reached while a phase's closing drain ran on
                self._mark_stop()
                raise _Interrupt("stop_minute")
            yield from self._phase(ph)
        self._close_open_cells("completed")

    def _estimate_ns(self, fixture: str) -> int:
        s, n = self.estimates.get(fixture, (0.0, 0))
        if n:
            return int(s / n)
        plan = self.plan
        for f in plan.fixtures:  # type: ignore[union-attr]
            if f.name == fixture and f.request_estimate_s is not None:
                return int(f.request_estimate_s * NS_PER_S)
        return int(plan.timing.request_estimate_s * NS_PER_S)  # type: ignore[union-attr]

    def _phase_requests(self, ph: PhaseSpec) -> list[int]:
        n = int(self.fixtures.get(ph.fixture or "", {}).get("count", 0))
        idx = list(range(n))
        if ph.select_last:
            idx = idx[-ph.select_last:]
        if ph.order == "reverse":
            idx.reverse()
        return idx * ph.passes

    def _phase(self, ph: PhaseSpec) -> Proc:
        plan = self.plan
        assert plan is not None and self.t0 is not None
        timing = plan.timing
        if ph.id in self.cells:  # already decided, e.g. deferred with its whole arm
            return
        if ph.incarnation in self.failed_incarnations:
            self._cell(ph.id, "failed", self.failed_incarnations[ph.incarnation])
            return
        if ph.incarnation in self.unverified_incarnations:
            self._cell(ph.id, "invalid", self.unverified_incarnations[ph.incarnation], comparable=False)
            return
        for dep in ph.requires_measured:
            if self.cells.get(dep, {}).get("status") != "measured":
                self._cell(ph.id, "deferred", f"not started: earlier result: {dep} was not measured", comparable=ph.comparable)
                return
        reqs = self._phase_requests(ph) if ph.kind == "replay" else []
        est = self._phase_estimate_ns(ph)
        if ph.incarnation != self.candidate_loaded:
            est += int(timing.load_estimate_s * NS_PER_S)
            if not ph.optional and not self._arm_fits(ph):
                return
        end = self.now + est
        if end > self._stop_ns():
            self._cell(ph.id, "deferred", f"not started: estimated end at minute {self._minute(end):.1f} passes the stop"
                       f" minute {timing.stop_min:g}", comparable=ph.comparable)
            return
        if ph.incarnation != self.candidate_loaded:
            ok = yield from self._fresh_incarnation(ph.incarnation)
            if not ok:
                self._cell(ph.id, "failed", self.failed_incarnations[ph.incarnation])
                return
        self._emit(PhaseStarted(phase=ph.id, minute=self._minute(), estimated_end_minute=self._minute(end)))  # type: ignore[arg-type]
        if ph.kind == "identity":
            yield from self._identity_phase(ph)
        else:
            yield from self._replay_phase(ph, reqs)

    def _phase_estimate_ns(self, ph: PhaseSpec) -> int:
        """Window time a phase takes by the current estimate: its requests, and its drains."""
        timing = self.plan.timing  # type: ignore[union-attr]
        n = len(self._phase_requests(ph)) if ph.kind == "replay" else 0
        rounds = -(-n // max(ph.concurrency, 1))
        per_req = self._estimate_ns(ph.fixture) if ph.fixture else 0
        return rounds * per_req + int(2 * timing.drain_poll_s * timing.stable_observations * NS_PER_S)

    def _arm_fits(self, first: PhaseSpec) -> bool:
        """An arm (an incarnation and its required phases, e.g. B's prime and replay, which only make
        sense together) starts only if all of them fit before the stop minute less the plan's margin.
        Otherwise every phase of the arm is deferred, and no primary downtime is spent priming an arm
        whose replay could not run."""
        timing = self.plan.timing  # type: ignore[union-attr]
        arm = [p for p in expand_phases(self.plan) if p.incarnation == first.incarnation]  # type: ignore[arg-type]
        required = [p for p in arm if not p.optional and p.id not in self.cells]
        end = self.now + int(timing.load_estimate_s * NS_PER_S) + sum(self._phase_estimate_ns(p) for p in required)
        limit = self._stop_ns() - int(timing.arm_margin_min * NS_PER_MIN)
        if end <= limit:
            return True
        why = (f"not started: arm {first.incarnation} ({', '.join(p.id for p in required)}) would end at minute "
               f"{self._minute(end):.1f} by the current estimate, past the stop minute {timing.stop_min:g} less the "
               f"margin of {timing.arm_margin_min:g} min")
        for p in arm:
            self._cell(p.id, "deferred", why, comparable=p.comparable)
        return False

    def _fresh_incarnation(self, label: str) -> Generator[Any, Any, bool]:
        cand = self.candidate_recipe
        if self.candidate_loaded is not None:
            res = yield from self._act("unload", {"recipe": cand, "sha256": self.candidate_sha})
            if not res.ok:
                self.failed_incarnations[label] = f"unload of incarnation {self.candidate_loaded} failed: {res.detail}"
                return False
        self.candidate_loaded = None
        self.ref_labels = None
        res = yield from self._act("load", {"recipe": cand, "sha256": self.candidate_sha, "label": label})
        if not res.ok:
            self.failed_incarnations[label] = f"candidate incarnation {label} did not load: {res.detail or res.error}"
            return False
        self.candidate_loaded = label
        self.candidate_id = res.data.get("incarnation")
        return True

    def _identity_phase(self, ph: PhaseSpec) -> Proc:
        plan = self.plan
        assert plan is not None
        ident_res = yield from self._act("read_identity", {})
        if not ident_res.ok:
            self._cell(ph.id, "failed", f"identity could not be read: {ident_res.detail}")
            return
        ident = ident_res.data
        mism = rules.identity_mismatches(expected_identity(plan), ident, trace=False)
        if self.candidate_sha and ident.get("recipe_sha256") != self.candidate_sha:
            mism.append(f"recipe_sha256: expected {self.candidate_sha}, found {ident.get('recipe_sha256')}")
        if self.candidate_id is not None and ident.get("incarnation") != self.candidate_id:
            mism.append(f"incarnation: expected {self.candidate_id}, found {ident.get('incarnation')}")
        if mism:
            self._abort_inside("identity_drift", f"{ph.id}: " + "; ".join(mism))
        self.ref_labels = {k: ident.get(k) for k in ("image", "flare_commit", "package", "model", "incarnation", "recipe_sha256")}
        reason = "identity verified without generation"
        if ph.fresh:
            m = yield from self._act("scrape_metrics", {})
            if not m.ok:
                self._cell(ph.id, "failed", f"metrics could not be read: {m.detail}")
                return
            nonzero = rules.counters_reset(m.data.get("counters", {}))
            g = m.data.get("gauges", {})
            occupancy = ("host_cache_records", "host_cache_bytes_used", "rows_used", "pages_used", "host_cache_tokens_used")
            occupied = [k for k in occupancy if g.get(k)]
            observable = any(g.get(k) is not None for k in occupancy)
            if nonzero or occupied:
                why = f"fresh incarnation {ph.incarnation} not verified: counters not reset ({', '.join(nonzero[:4]) or 'none'}); host cache occupied ({', '.join(occupied) or 'none'})"
                self.unverified_incarnations[ph.incarnation] = why
                self._cell(ph.id, "invalid", why, comparable=False)
                return
            reason += ("; counters reset and empty host cache verified" if observable else
                       "; counters reset verified; host cache occupancy not observable on this target")
        self._cell(ph.id, "measured", reason, requests=0)

    def _drain(self, timeout_s: float, purpose: str, router: bool = False) -> Generator[Any, Any, bool]:
        start = self.now
        polls = [0]
        settled = yield from self._drain_polls(timeout_s, router, polls)
        self._emit(DrainObserved(purpose=purpose, settled=settled, waited_s=round((self.now - start) / NS_PER_S, 3),
                                 polls=polls[0], minute=self._minute()))
        return settled

    def _drain_polls(self, timeout_s: float, router: bool, polls: list[int]) -> Generator[Any, Any, bool]:
        timing = self.plan.timing  # type: ignore[union-attr]
        start = self.now
        stable, last = 0, None
        while True:
            polls[0] += 1
            calls = [("scrape_metrics", {})] + ([("snapshot", {"what": "router"})] if router else [])
            res = yield from self._act_all(calls)
            m = res[0]
            ok = m.ok and rules.drained(m.data.get("gauges", {}))
            if router and len(res) > 1 and res[1].ok:
                b = res[1].data.get("backend") or {}
                ok = ok and not b.get("inflight")
            if ok:
                counters = m.data.get("counters", {})
                stable = stable + 1 if last is not None and counters == last else 1
                last = counters
                if stable >= timing.stable_observations:
                    self.last_counters = counters
                    return True
            else:
                stable, last = 0, None
            if self.now - start >= int(timeout_s * NS_PER_S):
                return False
            yield _Sleep(self.now + int(timing.drain_poll_s * NS_PER_S))

    def _replay_phase(self, ph: PhaseSpec, reqs: list[int]) -> Proc:
        plan = self.plan
        assert plan is not None
        fixture = self.fixtures.get(ph.fixture or "", {})
        shas = fixture.get("sha256", [])
        if ph.trace is not None:
            res = yield from self._act("set_trace", {"enabled": ph.trace})
            if not res.ok or res.data.get("trace_enabled") != ph.trace:
                self._cell(ph.id, "failed", f"trace could not be set {'on' if ph.trace else 'off'}: {res.detail}", comparable=False)
                return
            # a toggle may change trace_enabled and nothing else: drift is watched through trace arms too
            mism = rules.identity_mismatches(expected_identity(plan), res.data, trace=ph.trace)
            mism += rules.label_drift({k: v for k, v in (self.ref_labels or {}).items()
                                       if k in ("incarnation", "recipe_sha256")}, res.data)
            if mism:
                self._abort_inside("identity_drift", f"{ph.id}: the trace toggle changed more than trace_enabled: "
                                   + "; ".join(mism))
        self.current = {"id": ph.id, "done": 0, "total": len(reqs), "comparable": ph.comparable}
        settled = yield from self._drain(plan.timing.drain_timeout_s, f"before {ph.id}")
        if not settled:
            self.current = None
            self._cell(ph.id, "invalid", f"drain before the phase did not settle within {plan.timing.drain_timeout_s:g} s",
                       comparable=ph.comparable)
            return
        before = dict(self.last_counters or {})
        prev = before
        failures: list[str] = []
        natural = 0
        k = 0
        while k < len(reqs):
            batch = reqs[k:k + ph.concurrency]
            if self.now + self._estimate_ns(ph.fixture or "") > self._stop_ns():
                self.current = None
                self._cell(ph.id, "invalid", f"stopped after {k} of {len(reqs)} requests: the next request's estimated"
                           f" end passes the stop minute {plan.timing.stop_min:g}", requests=k, comparable=ph.comparable)
                return
            calls = [("send_request", {"phase": ph.id, "fixture": ph.fixture, "order_index": k + j, "body_index": bi,
                                       "body_sha256": shas[bi] if bi < len(shas) else ""})
                     for j, bi in enumerate(batch)]
            ids = [self._request(a, args, True) for a, args in calls]
            for i in ids:
                self.sent_at[i] = self.now
            results = yield _Act(ids)
            for i, rd in zip(ids, results):
                if isinstance(rd, RequestDone) and rd.outcome == "ok":
                    s, n = self.estimates.get(ph.fixture or "", (0.0, 0))
                    self.estimates[ph.fixture or ""] = (s + (rd.at_ns - self.sent_at.pop(i, rd.at_ns)), n + 1)
            delta: dict = {}
            if ph.concurrency == 1:
                m = yield from self._act("scrape_metrics", {})
                if m.ok:
                    delta = rules.counter_delta(prev, m.data.get("counters", {}))
                    prev = m.data.get("counters", {})
            for j, rd in enumerate(results):
                nf = None
                if isinstance(rd, RequestDone):
                    if rd.outcome != "ok":
                        failures.append(f"#{rd.order_index}: {rd.error or rd.outcome}")
                    else:
                        nf = rules.natural_failure(rd.finish_reason, rd.visible_output)
                        natural += nf is not None
                    self._emit(RequestMeasured(phase=ph.id, order_index=rd.order_index, body_index=rd.body_index,
                                               body_sha256=rd.body_sha256, outcome=rd.outcome, natural_failure=nf,
                                               delta=delta if ph.concurrency == 1 else {}))
                else:
                    failures.append(f"#{k + j}: {rd.error}")
            k += len(batch)
            self.current["done"] = k  # type: ignore[index]
        self.draining_after = True
        settled = yield from self._drain(plan.timing.drain_timeout_s, f"after {ph.id}")
        self.draining_after = False
        self.current = None
        after = self.last_counters if settled else prev
        delta = rules.counter_delta(before, after or {})
        host, gpu = rules.host_gpu(delta)
        common = dict(requests=len(reqs), host=host, gpu=gpu, comparable=ph.comparable, counters=delta,
                      natural_failures=natural)
        if not settled:
            self._cell(ph.id, "invalid", f"drain after the phase did not settle within {plan.timing.drain_timeout_s:g} s", **common)
        elif failures:
            self._cell(ph.id, "failed", f"{len(failures)} of {len(reqs)} requests failed: {', '.join(failures[:3])}", **common)
        else:
            why = f"{len(reqs)} requests" + (f", {natural} natural output failures recorded" if natural else "")
            if self.stop_marked:
                why += (f"; its closing drain settled at minute {self._minute():.2f}, after the stop minute "
                        f"{plan.timing.stop_min:g} (all its requests had finished before it)")
            if not ph.comparable:
                full = len(fixture.get("sha256", [])) or "full"
                why += f"; non-fresh initial state, not comparable to the {full}-prompt arms"
            self._cell(ph.id, "measured", why, **common)

    # --- the restore procedure ---------------------------------------------------------------

    def _restore(self) -> Proc:
        yield _Quiet()
        checks: dict[str, Any] = {}
        inc = self.incumbent or {}
        st = yield from self._act("manager_state", {})
        loaded = (st.data.get("loaded") if st.ok else None) or None
        if not inc.get("sha256") and loaded:
            inc = {"recipe": loaded.get("recipe"), "sha256": loaded.get("sha256"), "identity": {}}
        if inc.get("sha256"):
            if loaded and loaded.get("sha256") != inc["sha256"]:
                yield from self._act("unload", {"recipe": loaded.get("recipe"), "sha256": loaded.get("sha256")})
            if not loaded or loaded.get("sha256") != inc["sha256"]:
                for _attempt in range(2):
                    r = yield from self._act("load", {"recipe": inc["recipe"], "sha256": inc["sha256"], "label": "incumbent"})
                    if r.ok:
                        break
        ident = yield from self._act("read_identity", {})
        checks["incumbent_sha256_match"] = bool(ident.ok and inc.get("sha256")
                                                 and ident.data.get("recipe_sha256") == inc.get("sha256"))
        if checks["incumbent_sha256_match"] and inc.get("identity"):
            drift = rules.identity_mismatches({k: inc["identity"].get(k) for k in rules.IDENTITY_FIELDS if k in inc["identity"]},
                                              ident.data)
            checks["incumbent_sha256_match"] = not drift
        router_snap, gpu_snap = self.snapshots.get("router"), self.snapshots.get("gpu")
        now_router, now_gpu = yield from self._act_all([("snapshot", {"what": "router"}), ("snapshot", {"what": "gpu"})])
        contained: bool | None = True if router_snap is not None or gpu_snap is not None else None  # None: nothing to contain
        if router_snap is not None:
            contained = now_router.ok and now_router.data.get("config_sha256") == router_snap.get("config_sha256")
        if gpu_snap is not None:
            uu = lambda d: sorted((g.get("uuid"), g.get("power_limit_w")) for g in d.get("gpus", []))  # noqa: E731
            contained = contained and now_gpu.ok and uu(now_gpu.data) == uu(gpu_snap)
        checks["containment"] = None if contained is None else bool(contained)
        mon = yield from self._act("snapshot", {"what": "monitoring"})
        if mon.error == "not_applicable":
            checks["monitoring_registered"] = None
        else:
            t = mon.data.get("target") or {}
            checks["monitoring_registered"] = bool(mon.ok and t.get("registered") and t.get("healthy"))
        direct = yield from self._act("preflight", {"path": "direct"})
        checks["direct_preflight"] = bool(direct.ok)
        unready = [k for k in ("incumbent_sha256_match", "direct_preflight", "containment") if checks[k] is False]
        if "router" in self.snapshots and self.snapshots["router"] is None:  # the site has no router
            checks["readmitted"] = None
            checks["routed_preflight"] = None
        elif unready:
            # Routing production traffic to a primary whose restore did not verify would turn a
            # failed window into an outage: it stays quiesced until a person has looked.
            checks["readmitted"] = False
            checks["routed_preflight"] = False
            self._emit(Alarm(kind="primary_left_quiesced",
                             detail=f"not readmitted to the router: {', '.join(unready)} failed"))
        else:
            re = yield from self._act("readmit", {})
            checks["readmitted"] = None if re.error == "not_applicable" else bool(re.ok and (re.data.get("admitted", True)))
            routed = yield from self._act("preflight", {"path": "routed"})
            checks["routed_preflight"] = None if routed.error == "not_applicable" else bool(routed.ok)
        verified = all(v is not False for v in checks.values())
        self._emit(RestorationRecorded(checks=checks, verified=verified, started_minute=self.restore_started,
                                       finished_minute=self._minute()))
        hyp, basis, nxt = verdict(self.cells, self.required)
        self._emit(VerdictReached(hypothesis=hyp, basis=basis, next_experiment=nxt, findings=findings(self.cells)))
        # `completed` only when every required cell was measured (contract 4, amended)
        complete = all(self.cells.get(p, {}).get("status") == "measured" for p in self.required)
        outcome = ("restore_failed" if not verified else "aborted" if self.abort else
                   "completed" if complete else "partial")
        self._emit(WindowClosed(outcome=outcome, minute=self._minute()))
