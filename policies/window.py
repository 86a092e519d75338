"""The window state machine: the seed's execution contract as a pure, replayable decider.

`WindowPolicy.receive(input) -> decisions` is the whole interface (the sans-I/O shape of h11):
the runner appends each input to the log, feeds it here, appends the decisions, and carries
them out. Time is only what inputs carry (`at_ns`, the window clock). The procedures (the
experiment in `policies.takedown`, then the plan's method from `policies.methods`, the restore in
`policies.restore`) are generators run by
`policies.driver`; this module routes inputs, applies the guards and the clock, keeps the cells
ledger, and replaces the experiment with the restore on an abort or at the stop minute.
"""

from __future__ import annotations

from typing import Any

import msgspec

from flare_diag.events.answers import WATCHES, Answer, GpuView, MetricsSample, UnexpectedAnswer, answer_type, convert, read
from flare_diag.events.stages import BEFORE_RESTORE, Stage
from flare_diag.events.schema import (
    NS_PER_MIN,
    ActionDone,
    Alarm,
    BoundsScaled,
    CancelRequested,
    DaemonRestarted,
    Input,
    LogUnwritable,
    OperatorAbort,
    RequestDone,
    RestoreStarted,
    Tick,
    TimeMarked,
    WatchFailed,
    WatchObserved,
    WindowOpened,
)
from flare_diag.policies import guards, restarts, rules, steady
from flare_diag.policies.core import RE_ASKABLE, READS, WindowCore  # noqa: F401  (RE_ASKABLE: the tests')
from flare_diag.policies.driver import Sleep
from flare_diag.policies.evolve import (
    ActionAnswered,
    ActionDropped,
    ClockAdvanced,
    Closed,
    CountersScraped,
    GrowthObserved,
    GuardEvaluated,
    GuardSaid,
    IdentityDrifted,
    Opened,
    QuiesceNotSent,
    RequestAnswered,
    RequestRefused,
    RestoreBegun,
    RestoreOverran,
    RestoreRestarted,
    RuleDisabled,
    WatchAnswered,
    WatchFailing,
    XidsJudged,
)
from flare_diag.policies.methods import method_named
from flare_diag.policies.plan import PlanError, plan_from_builtins
from flare_diag.policies.planner import Calibration, all_phases, arms
from flare_diag.policies.restore import restore
from flare_diag.policies.scaling import scaled_bounds
from flare_diag.policies.takedown import experiment


class WindowPolicy(WindowCore):
    """One window's decisions. Deterministic: the same inputs always give the same decisions."""

    # --- the interface -----------------------------------------------------------------------

    def receive(self, inp: Input) -> list[Any]:
        out: list[Any] = []
        self._out = out
        if self.state.stage == Stage.CLOSED:
            return out
        self.apply(ClockAdvanced(at_ns=inp.at_ns))
        if isinstance(inp, WindowOpened):
            if self.state.stage == Stage.IDLE:
                self._open(inp)
        elif self.state.stage == Stage.IDLE:
            return out
        elif isinstance(inp, (ActionDone, RequestDone)):
            self._outcome(inp)
        elif isinstance(inp, WatchObserved) and (why := _malformed_watch(inp)):
            self.apply(WatchFailing(source=inp.source, why=f"malformed_transport: {why}"))  # silent, as a watch that failed
        elif isinstance(inp, WatchObserved):
            if inp.source != "prometheus":
                self.apply(WatchAnswered(source=inp.source, at_ns=inp.at_ns))
            self._watch(inp)
        elif isinstance(inp, WatchFailed):
            self.apply(WatchFailing(source=inp.source, why=f"{inp.error}: {inp.detail}" if inp.detail else inp.error))
        elif isinstance(inp, OperatorAbort):
            self._abort_from_outside("operator", inp.reason or "operator abort")
        elif isinstance(inp, LogUnwritable):
            self.emit(Alarm(kind="log_unwritable", detail=inp.detail))
            self._abort_from_outside("store_failure", f"the event log cannot be written ({inp.detail}); "
                                                      f"restoring from memory")
        elif isinstance(inp, DaemonRestarted):
            self._answers_lost(inp)
            if inp.mismatches:
                # the replay cannot be trusted to have rebuilt the window's state exactly: restore
                # from it anyway (the restore reads what is loaded), and say so
                self.emit(Alarm(kind="resume_mismatch", detail="; ".join(inp.mismatches)))
            self._abort_from_outside("daemon_restart", "the daemon restarted inside the window")
        elif not isinstance(inp, Tick):
            # an observation this decider has no rule for is never dropped: the state it would have
            # changed cannot be trusted, so the window restores and no cell names a cause
            name = type(inp).__name__
            self.emit(Alarm(kind="unexpected_input", detail=f"{name} at window time {inp.at_ns} ns"))
            self._abort_from_outside("unexpected_input", f"an input this decider has no rule for: {name}")
        self._check_time()
        self._advance()
        return out

    def next_wakeup_ns(self) -> int | None:
        """The earliest window time at which a Tick may change something, or None."""
        if self.state.stage in (Stage.IDLE, Stage.CLOSED):
            return None
        times = []
        if isinstance(self.state.waits, Sleep):
            times.append(self.state.waits.until_ns)
        if self.state.t0 is not None:
            if self.state.stage in BEFORE_RESTORE:
                times += [t + 1 for t in self._watch_deadlines().values()]
            if self.state.stage in BEFORE_RESTORE and not self.state.stop_marked:
                times.append(self.stop_ns())
            elif self.state.stage in BEFORE_RESTORE and self.state.draining_after:
                times.append(self._closing_drain_end_ns())
            elif not self.state.overrun_marked:
                times.append(self.state.t0 + int(self.plan.timing.window_min * NS_PER_MIN))
        return min(times) if times else None

    # --- time ----------------------------------------------------------------------------------

    def _check_time(self) -> None:
        if self.state.t0 is None or self.plan is None:
            return
        if self.state.stage in BEFORE_RESTORE:
            for src, deadline in self._watch_deadlines().items():
                if self.now > deadline:
                    if src.startswith("guard:"):
                        last = self.state.watch_failure.get("prometheus")
                        self._abort_from_outside("watch_lost", f"steady-state guard {src[6:]} has had no number from "
                                                 f"Prometheus for over {self.watch_lost_s():g} s, so it cannot be enforced"
                                                 + (f" (last failure: {last})" if last else ""))
                        return
                    last = self.state.watch_failure.get(src)
                    self._abort_from_outside("watch_lost", f"the {'GPU' if src == 'gpu' else 'router'} watch has not answered "
                                             f"for over {self.watch_lost_s():g} s"
                                             + (f" (last failure: {last})" if last else ""))
                    return
        if self.state.stage in BEFORE_RESTORE and self.now >= self.stop_ns():
            self.mark_stop()
            # a phase whose requests have all finished is judged on them: its closing drain (bounded
            # by the drain timeout, no experimental request in it) runs on, then the window restores
            # (at most for the drain timeout: a hung scrape in it must not eat the reservation)
            if not self.state.draining_after or self.now >= self._closing_drain_end_ns():
                self._interrupt_outside("stop_minute")
        end = self.state.t0 + int(self.plan.timing.window_min * NS_PER_MIN)
        if self.state.stage == Stage.RESTORE and self.now >= end and not self.state.overrun_marked:
            self.apply(RestoreOverran())
            self.emit(TimeMarked(mark="window_end", minute=self.minute(end)))  # type: ignore[arg-type]  # after the quiesce: a minute, never None
            self.emit(Alarm(kind="restore_overrun",
                             detail=f"restore still running at minute {self.minute()}, past the window end"))

    # --- opening, guards and aborts ------------------------------------------------------------

    def _open(self, inp: WindowOpened) -> None:
        self.plan = plan_from_builtins(inp.plan, "window plan")
        self.window_id = inp.window_id
        self.time_scale = inp.time_scale if inp.time_scale and inp.time_scale > 0 else 1.0
        self.candidate_recipe = inp.candidate_recipe
        self.steady_state = inp.steady_state
        self.reuse_identity = list(inp.reuse_identity)
        self.startup = (inp.startup_requests, inp.startup_generated_each)
        self.expected_incumbent = inp.expected_incumbent_sha256
        self.calibration = msgspec.convert(inp.calibration, Calibration) if inp.calibration else None
        method = method_named(self.plan.method)
        if method is None:  # a log recorded by a build that had this method, read by one that has not
            raise PlanError(f"window plan: method = {self.plan.method!r}: not a method this build has")
        self.method = method
        self.arms = arms(self.plan)
        self.all_phases = all_phases(self.plan)
        self.phase_order = [p.id for p in self.all_phases] + [c.id for c in self.plan.conditional]
        self.comparable = {p.id: p.comparable for p in self.all_phases}
        self.required = [p.id for p in self.all_phases if not p.optional]
        self.apply(Opened())
        raised = scaled_bounds(self.plan.timing, self.time_scale)
        if raised:
            self.emit(BoundsScaled(bounds=[msgspec.to_builtins(b) for b in raised]))
        self._start(experiment(self), self._procedure_ended)

    def _procedure_ended(self, cause: str | None) -> None:
        if self.state.stage in BEFORE_RESTORE:
            self._begin_restore(cause or "completed")
        else:
            self.apply(Closed())

    def _answers_lost(self, restarted: DaemonRestarted) -> None:
        """The daemon restarted: no outstanding action's answer will come. A read of the restore's is asked
        again (only a host change is never repeated), its answer still the one the restore waits on; every
        other action is answered `lost_in_restart`."""
        for aid, asked in sorted(self.state.asked.items()):
            if asked.reaskable and not asked.experimental:
                self.apply(ActionDropped(action_id=aid))
                self.request(asked.request.name, asked.request.args(), for_id=asked.for_id)
                continue
            self.apply(ActionAnswered(action_id=aid, answer=ActionDone(
                at_ns=restarted.at_ns, action_id=aid, ok=False, error="lost_in_restart",
                detail="the daemon restarted before its outcome was recorded; possibly done")))

    def _outcome(self, inp: ActionDone | RequestDone) -> None:
        asked = self.state.asked.get(inp.action_id)
        if asked is None:
            return  # an outcome nobody waits for (answered already, or never asked) changes nothing
        inp = self._decoded(inp, answer_type(asked.request))
        action = asked.request.name
        if action == "quiesce" and isinstance(inp, ActionDone) and inp.error == "not_carried_out":
            # never sent (its decision was not in the log): the primary was never taken out of rotation,
            # so the restore has nothing to readmit and an admitted backend is no breach
            self.apply(QuiesceNotSent())
        # an answer to a read asked again after a restart is the answer the restore waits for under the first id
        self.apply(ActionAnswered(action_id=inp.action_id, answer=inp))
        if isinstance(inp, ActionDone) and inp.ok and action == "scrape_metrics":
            sample = read(MetricsSample, inp)
            label = sample.labels.get("incarnation")
            incarnation = label if isinstance(label, str) else None
            restarted = self.state.restart_watch.restart_seen(sample.counters, sample.gauges, incarnation)
            self.apply(CountersScraped(counters=dict(sample.counters), gauges=dict(sample.gauges), incarnation=incarnation))
            if restarted:
                self._engine_restarted(restarted)
        if self.state.stage == Stage.RESTORE:
            self._restore_outcome(inp)
            return
        if self.state.stage not in BEFORE_RESTORE:
            return
        health = inp.health_after
        gone = health is not None and rules.engine_gone(inp.error, health)
        # a /health that could not be read is what the procedure that asked it judges (the engine gone), never a
        # broken transport in its own right: vLLM's API server exits soon after its EngineCore died
        judged_by_asker = action == "health"
        reason = "engine_lost" if gone else None if judged_by_asker else rules.abort_for_error(inp.error)
        if reason:
            # a request by its phase and order, as cells and the report number it (an action id is no request's number)
            where = f"{inp.phase} #{inp.order_index} (action {inp.action_id})" if isinstance(inp, RequestDone) \
                else f"action {inp.action_id}"
            detail = f"{where}: {inp.detail or inp.error}"
            if health is not None and reason in ("engine_lost", "engine_stalled"):
                detail = f"{detail}; /health then {rules.health_words(health)}"
            self._abort_from_outside(reason, detail)
            return
        if isinstance(inp, RequestDone):
            self._refusal(inp)
            return
        if isinstance(inp, ActionDone) and inp.ok:
            hit = guards.action_observation(inp.data, self.state.ref_labels, self.state.quiesced, self.plan.growth,
                                            self.plan.identity.host_cache_bytes)
            gauges = inp.data.get("gauges")
            if hit is None and self.state.quiesced and isinstance(gauges, dict):
                in_flight = sum(1 for a in self.state.asked.values() if a.experimental)
                hit = self.state.baseline.check(gauges, in_flight, self.plan.growth)[1]
                self.apply(GrowthObserved(gauges=gauges, in_flight=in_flight, growth=self.plan.growth))
            if hit:
                self._abort_from_outside(*hit)

    @staticmethod
    def _decoded(inp: ActionDone | RequestDone, kind: type[Answer] | None) -> ActionDone | RequestDone:
        """An answer that is not its action's shape is never read in part: it is the host's malformed
        answer, a failed action (the runner checks at the host's edge; this holds any other executor to it)."""
        if kind is None or not isinstance(inp, ActionDone) or not inp.ok:
            return inp
        try:
            convert(kind, inp.data, f"action {inp.action_id}")
        except UnexpectedAnswer as exc:
            return ActionDone(at_ns=inp.at_ns, action_id=inp.action_id, ok=False, error="malformed_transport",
                              detail=str(exc))
        return inp

    def _restore_outcome(self, inp: ActionDone | RequestDone) -> None:
        """An outcome during the restore: a GPU fault at any moment, and once the window's candidate is
        unloaded (the incumbent loading, loaded, checked) any growth bound crossed, until the readmit."""
        if rules.abort_for_error(inp.error) == "gpu_fault":
            self.restore_fault(f"gpu_fault: action {inp.action_id}: {inp.detail or inp.error}")
        if isinstance(inp, ActionDone) and inp.ok and self.state.restore_unloaded and not self.state.readmit_requested:
            hit = guards.action_observation(inp.data, None, True, self.plan.growth, self.plan.identity.host_cache_bytes)
            if hit:
                self.restore_fault(f"{hit[0]}: during the restore: {hit[1]}")

    def _refusal(self, rd: RequestDone) -> None:
        """Consecutive requests the host refused for what they are (a 4xx other than 401/403/429):
        `[abort] rejected_streak` of them abort `rejected`; any request answered ends the run."""
        if rd.outcome == "ok":
            self.apply(RequestAnswered())
            return
        if not restarts.refused(rd.status_code):
            return
        self.apply(RequestRefused(request=rd))
        streak = self.plan.abort.rejected_streak
        if len(self.state.refused_run) >= streak:
            first = self.state.refused_run[0]
            self._abort_from_outside("rejected", f"the host refused {streak} consecutive requests (HTTP {first.status_code}), "
                                                 f"first {first.phase} #{first.order_index} (body {first.body_index}, "
                                                 f"sha256 {first.body_sha256[:12]}): {first.detail or first.error}")

    def _engine_restarted(self, detail: str) -> None:
        """An unseen restart: the experiment aborts (every phase spanning it invalid); a restore starts over."""
        if self.state.stage in BEFORE_RESTORE:
            self._abort_from_outside("engine_restart", detail)
        elif self.state.stage == Stage.RESTORE and not self.state.readmit_requested:
            self.apply(RestoreRestarted())
            self.emit(Alarm(kind="engine_restart_during_restore", detail=detail + "; the restore starts over from its first check"))
            if self.state.abort is None:
                self._record_abort("engine_restart", detail + " (during the restore)")

    def _gpu_rules_disabled(self, data: dict[str, Any]) -> None:
        """GPUs whose Xid events NVML cannot report, or an Xid watch that failed: the rules it
        disables are named once in an alarm; a production window cannot go on without them."""
        why = guards.gpu_rules_disabled(data)
        if why is None or why in self.state.rules_disabled:
            return
        self.apply(RuleDisabled(why=why))
        self.emit(Alarm(kind="rule_disabled", detail=why))
        if self.plan.production and self.state.stage in BEFORE_RESTORE:
            self._abort_from_outside("watch_lost", why)

    def _watch(self, inp: WatchObserved) -> None:
        """A watch's answer, judged by the rules of its source (guards.WATCH_RULES) where they apply:
        the router once the quiesce took effect, the identity while a phase runs, against what each
        is held to."""
        if inp.source == "gpu":
            self._gpu_rules_disabled(inp.data)
            self.apply(XidsJudged(n=len(convert(GpuView, inp.data, "gpu watch").xid_events)))
        if self.state.stage not in (*BEFORE_RESTORE, Stage.RESTORE):
            return
        if inp.source == "prometheus":
            self._guard_evaluated(inp)
            return
        polled = inp.data.get("polled_at_ns", inp.at_ns)
        ctx = guards.Context(self.plan.growth, self.state.snapshots.get("gpu"), self.state.snapshots.get("router"),
                             direct_inflight=sum(a.request.name == "send_request" for a in self.state.asked.values()))
        if inp.source == "router":
            # a poll sent before the quiesce took effect says nothing of containment after it; after
            # the readmit an admitted backend is the readmission; a breach already aborted for is not news
            if not self.state.quiesced or polled < self.state.quiesced_at_ns or self.state.readmit_requested or \
                    (self.state.stage == Stage.RESTORE and self.state.abort is not None and self.state.abort.reason == "containment"):
                return
        elif inp.source == "identity":
            # between the phase's own reads (at C4 a round can last many seconds): held to the identity
            # verified for the incarnation the phase runs on; a poll sent before the phase began (it
            # may have crossed a load) says nothing about it
            if self.state.stage not in BEFORE_RESTORE or self.state.current is None or polled < self.state.current_since_ns:
                return
            label = next((p.incarnation for p in self.all_phases if p.id == self.state.current.id), "")
            ctx = guards.Context(self.plan.growth, identity=self.state.verified_identity.get(label),
                                 where=f"{self.state.current.id}: identity watch")
        elif inp.source == "gpu" and self.state.stage == Stage.RESTORE:
            # the restore's GPUs are held to the snapshot only at its last gate, once the incumbent is back
            ctx = guards.Context(self.plan.growth)
        hit = guards.judge(inp.source, inp.data, ctx)
        if not hit:
            return
        if self.state.stage in BEFORE_RESTORE:
            if inp.source == "identity" and hit[0] == "identity_drift":
                self.apply(IdentityDrifted())
            self._abort_from_outside(*hit)
        # during the restore: an Xid or a containment breach at any moment; the other rules (GPU
        # memory here, everything at the last gate) once the incumbent is back and until its readmit
        elif hit[0] in ("gpu_fault", "containment") or (self.state.restore_unloaded or self.state.incumbent_back) \
                and not self.state.readmit_requested:
            self.restore_fault(f"{hit[0]}: {hit[1]}")

    def _guard_evaluated(self, inp: WatchObserved) -> None:
        """One steady-state guard's evaluation by the runner's watch: `consecutive` breaches in a row
        abort the experiment (`steady_state`); during the restore they raise an alarm and the restore
        goes on (readmitting the primary is what relieves the pool); a dry run only says what it would
        have done, once."""
        g = next((x for x in (self.plan.guards if self.steady_state else []) if x.name == inp.data.get("guard")), None)
        if g is None:
            return
        value = steady.worst(g, inp.data.get("values") or [])
        if value is not None:
            self.apply(WatchAnswered(source=f"guard:{g.name}", at_ns=inp.at_ns))
        run = self.state.guard_runs.observe(g, value)[1]
        self.apply(GuardEvaluated(guard=g, value=value))
        stage = "experiment" if self.state.stage in BEFORE_RESTORE else "restore"
        if value is None or run < g.consecutive or not steady.guards_stage(g, stage):
            return
        what = steady.breach_words(g, value, run)
        if g.dry_run:
            if g.name not in self.state.guard_runs.dry_run_said:
                self.apply(GuardSaid(name=g.name, dry_run=True))
                m = self.minute()
                self.emit(Alarm(kind="guard_dry_run", detail=f"dry run: would have {'aborted' if stage == 'experiment' else 'alarmed'} "
                                                              + (f"at minute {m:.2f}" if m is not None else "before the quiesce")
                                                              + f": {what}"))
        elif stage == "experiment":
            self._abort_from_outside("steady_state", what)
        elif g.name not in self.state.guard_runs.restore_said and not self.state.readmit_requested:
            # once per run of breaches; after the readmit the restore's own evaluation judges the pool
            self.apply(GuardSaid(name=g.name, dry_run=False))
            self.emit(Alarm(kind="steady_state_during_restore", detail=what))

    def _abort_from_outside(self, reason: str, detail: str) -> None:
        if self.state.stage not in BEFORE_RESTORE:
            return
        self._record_abort(reason, detail)
        self._interrupt_outside("abort")

    def _interrupt_outside(self, cause: str) -> None:
        self._stop()
        self._begin_restore(cause)

    def _begin_restore(self, cause: str) -> None:
        self.apply(RestoreBegun(cause=cause, started_minute=self.minute(),
                                end_ns=self.now + int(self.plan.timing.restore_budget() * NS_PER_MIN)))
        self.close_open_cells(cause)
        # The restore waits only for what changes the host (a load, an unload, a quiesce...), each
        # bounded by its deadline; experimental requests and reads are cancelled, so a hung scrape
        # or request cannot hold the reservation.
        cancel = sorted(aid for aid, a in self.state.asked.items() if a.experimental or a.request.name in READS)
        if cancel:
            self.emit(CancelRequested(action_ids=cancel, reason=cause))
        self.emit(RestoreStarted(cause=cause, minute=self.state.restore_started))
        self._start(restore(self), self._procedure_ended)


def _malformed_watch(inp: WatchObserved) -> str | None:
    """Why a watch's answer is not its source's shape (events/answers.py), or None."""
    kind = WATCHES.get(inp.source)
    data = (inp.data.get("identity") or {}) if inp.source == "identity" else inp.data
    if kind is None:
        return None
    try:
        convert(kind, data, f"{inp.source} watch")
    except UnexpectedAnswer as exc:
        return str(exc)
    return None
