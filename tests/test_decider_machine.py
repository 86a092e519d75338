"""A Hypothesis rule-based state machine over the decider: observations, faults, restarts and clocks in
any order Hypothesis finds, with the seed's invariants checked after every step: no experimental request
and no experiment host change at or after the stop minute, the restore begun with its reservation left,
no cause named from a cell that was not measured (or after an abort that forbids one), no cell measured
on counters that cannot be (a part above its whole, more lookups than its requests) or on answers beyond
their bodies' max_tokens, nothing decided once closed, and the same inputs giving the same decisions."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from flare_diag.events.schema import (
    NS_PER_MIN, ActionDone, ActionRequested, CancelRequested, CellRecorded, DaemonRestarted, Decision, Input, OperatorAbort,
    RequestDone, RestoreStarted, Tick, TimeMarked, VerdictReached, WatchObserved,
)
from flare_diag.events.stages import BEFORE_RESTORE
from flare_diag.policies.rules import NO_CAUSE_ABORTS, counters_contradict
from flare_diag.policies.snapshot import snapshot
from flare_diag.policies.state import WindowSnapshot
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import WATCH_EVERY, S, World, opened_input, plan_builtins
from tests.test_policy_properties import FAULTS

RESERVE_MIN = 20
HOST_CHANGES = {"load", "unload", "quiesce", "readmit", "set_trace"}
SEED_CAUSES = {"A.reverse_replay"}  # the cell every hypothesis but `inconclusive` reads (contract 4)

ACTIONS = ["load", "unload", "quiesce", "readmit", "scrape_metrics", "read_identity", "send_request", "snapshot",
           "preview", "retain_recipe", "health"]
FAULT_CLASSES = [f for f in FAULTS if f]
HEALTHY_GPU = {"xid_events": [], "gpus": [{"uuid": "GPU-0", "memory_used_bytes": 1, "memory_total_bytes": 2}]}
WATCHES = st.sampled_from([
    ("gpu", HEALTHY_GPU),
    ("gpu", {"xid_events": [{"gpu": "GPU-1", "xid": 48}]}),
    ("router", {"config_sha256": "router-1", "backend": {"id": "primary", "admitted": False, "inflight": 0}}),
    ("router", {"config_sha256": "other", "backend": {}}),
    ("router", {"config_sha256": "router-1", "backend": {"id": "primary", "admitted": True, "inflight": 3}}),
])


class DeciderMachine(RuleBasedStateMachine):
    """One window's decider fed by a world that answers its actions, in an order Hypothesis chooses."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = WindowPolicy()
        self.pending: list[ActionRequested] = []
        self.history: list[tuple[Input, list[Decision]]] = []
        self.t0: int | None = None
        self.restore_at: int | None = None
        self.last_watch = 0
        self.silent: set[str] = set()  # watches that have stopped answering
        self.hang_s = 0.0  # the next request's answer comes this much later
        self.overlong_phases: set[str] = set()  # phases with an answer beyond its body's max_tokens
        self.prompt_first: dict[tuple[str, str], int] = {}  # (incarnation, body) -> the prompt tokens first answered
        self.reprompted_phases: set[str] = set()  # phases with a body answered at another prompt size than before
        self.replayed_phases: set[str] = set()  # phases with an answer naming an id an earlier answer on its incarnation named
        self.answers_seen: set[tuple[str, str]] = set()  # (incarnation, completion id) of every answer so far
        self.uncounted_phases: set[str] = set()  # phases with an answer the engine's counters left out
        self.slows: tuple[float, float] | None = None  # (window minute, seconds a request) the host slows down at
        self._slows_drawn: tuple[float, float] | None = None

    # --- feeding ---------------------------------------------------------------------------------

    def feed(self, inp: Input) -> None:
        if isinstance(inp, RequestDone) and self._beyond_max_tokens(inp):
            self.overlong_phases.add(inp.phase)
        if isinstance(inp, RequestDone) and self._prompt_changed(inp):
            self.reprompted_phases.add(inp.phase)
        if isinstance(inp, RequestDone) and self._replayed(inp):
            self.replayed_phases.add(inp.phase)
        if isinstance(inp, RequestDone) and inp.outcome == "ok" and inp.action_id in self.world.uncounted:
            self.uncounted_phases.add(inp.phase)
        ds = self.policy.receive(inp)
        self.history.append((inp, ds))
        for d in ds:
            if isinstance(d, ActionRequested):
                self.pending.append(d)
            elif isinstance(d, CancelRequested):
                self.pending = [p for p in self.pending if p.action_id not in d.action_ids]
            elif isinstance(d, TimeMarked) and d.mark == "t0":
                self.t0 = self.policy.state.t0
            elif isinstance(d, RestoreStarted):
                self.restore_at = inp.at_ns
        self.check_decisions(inp, ds)

    def _beyond_max_tokens(self, rd: RequestDone) -> bool:
        """The answer carries more tokens than its body's max_tokens (as the decider's plan and fixtures say)."""
        ph = next((p for p in self.policy.all_phases if p.id == rd.phase), None)
        work = self.policy.est.work.get(ph.fixture or "", []) if ph is not None and self.policy.est is not None else []
        return rd.outcome == "ok" and rd.completion_tokens is not None and rd.body_index < len(work) \
            and rd.completion_tokens > work[rd.body_index].max_tokens

    def _prompt_changed(self, rd: RequestDone) -> bool:
        """The answer counts another prompt size for its body than the same incarnation first answered with."""
        ph = next((p for p in self.policy.all_phases if p.id == rd.phase), None)
        if ph is None or rd.outcome != "ok" or rd.prompt_tokens is None or not rd.body_sha256:
            return False
        return self.prompt_first.setdefault((ph.incarnation or "", rd.body_sha256), rd.prompt_tokens) != rd.prompt_tokens

    def _replayed(self, rd: RequestDone) -> bool:
        """The answer names a completion id an earlier answer on the same incarnation named."""
        ph = next((p for p in self.policy.all_phases if p.id == rd.phase), None)
        if ph is None or rd.outcome != "ok" or not rd.answer_id:
            return False
        key = (ph.incarnation or "", rd.answer_id)
        seen = key in self.answers_seen
        self.answers_seen.add(key)
        return seen

    def check_decisions(self, inp: Input, ds: list[Decision]) -> None:
        """The invariants of one step's decisions, read against the window's clock."""
        if self.t0 is not None and self.policy.state.stage in BEFORE_RESTORE:
            assert self.policy.now <= self.t0 + self.stop_ns + self._closing_drain_ns(), \
                f"experiment still running at minute {self.policy.minute():.1f}"
        past_stop = self.t0 is not None and inp.at_ns >= self.t0 + self.stop_ns
        for d in ds:
            if isinstance(d, ActionRequested) and past_stop:
                assert not d.experimental, f"experimental {d.action} at {inp.at_ns / S:.0f} s, past the stop minute"
                if d.action in HOST_CHANGES:
                    assert self.restore_at is not None, f"{d.action} past the stop minute outside the restore"
            if isinstance(d, ActionRequested) and d.action == "load" and d.args.get("label") not in (None, "incumbent"):
                probe = self.policy.state.cells.get("A.reverse_replay")
                assert probe is None or not probe.not_fresh, \
                    f"incarnation {d.args['label']} loaded after the order probe ran on one that did not start cold"
            if isinstance(d, RestoreStarted) and self.t0 is not None:
                left = self.t0 + self.window_ns - inp.at_ns
                assert left >= RESERVE_MIN * NS_PER_MIN - self._closing_drain_ns(), \
                    f"restore began with {left / S:.0f} s of the window left"
            if isinstance(d, CellRecorded) and d.status == "measured" and d.host is not None:
                # a measured cell's counters are possible ones, and the window's own requests' alone
                assert not counters_contradict(d.host, d.gpu or {}), (d.phase, d.host, d.gpu)
                assert d.host.get("lookups") is None or d.host["lookups"] <= d.requests, (d.phase, d.host, d.requests)
            if isinstance(d, CellRecorded) and d.status == "measured":
                assert d.phase not in self.overlong_phases, f"{d.phase} measured on answers beyond their max_tokens"
                assert d.phase not in self.reprompted_phases, f"{d.phase} measured on bodies given as other prompts"
                assert d.phase not in self.replayed_phases, f"{d.phase} measured on answers given before"
                assert d.phase not in self.uncounted_phases, f"{d.phase} measured on answers its engine did not count"
                assert not d.requests or d.incarnation_id not in self.world.warm_incarnations, \
                    f"{d.phase} measured on incarnation {d.incarnation_id}, whose cache was not empty for its first request"
            if isinstance(d, VerdictReached) and d.hypothesis != "inconclusive":
                abort = self.policy.state.abort
                assert abort is None or abort.reason not in NO_CAUSE_ABORTS, (d.hypothesis, abort)
                for phase in SEED_CAUSES:
                    cell = self.policy.state.cells.get(phase)
                    assert cell is not None and cell.status == "measured" and cell.identity_held is not False, \
                        (d.hypothesis, phase, cell)

    def _closing_drain_ns(self) -> int:
        return int(self.policy.drain_timeout_s(self.policy.plan.timing.drain_timeout_s) * S)

    def _run_on(self, steps: int, until_ns: int | None = None) -> None:
        """As a healthy host and the runner would: each pending action answered in turn, and the clock
        moved to the decider's next wake-up when nothing is pending; `steps` of it, or until the window's
        clock (from its t0) passes `until_ns`."""
        for _ in range(steps):
            if self.policy.closed or until_ns is not None and self.t0 is not None and self.policy.now - self.t0 >= until_ns:
                return
            if self.pending:
                self._answer(self.pending.pop(0))
                continue
            wake = self.policy.next_wakeup_ns()
            if wake is None:
                return
            self.world.now = max(self.world.now, wake)
            self._watches_answer()
            if not self.policy.closed:
                self.feed(Tick(at_ns=self.world.now))

    def _answer(self, d: ActionRequested) -> None:
        """The host's answer to `d`, after the cost of it; meanwhile the watches answer and, as the runner
        sleeps no later than the decider's next wake-up, a Tick comes at each wake-up before it."""
        if self.slows is not None and self.t0 is not None and self.world.now - self.t0 >= self.slows[0] * NS_PER_MIN:
            self.world.request_s, self.slows = self.slows[1], None
        res = self.world.answer(d)
        if d.action == "send_request" and self.hang_s:
            # the request hangs: its answer comes this much later
            self.world.now += int(self.hang_s * S)
            res = msgspec.structs.replace(res, at_ns=self.world.now)
            self.hang_s = 0.0
        done_at = self.world.now
        while not self.policy.closed and (wake := self.policy.next_wakeup_ns()) is not None and wake < done_at:
            self.world.now = max(wake, self.policy.now)
            self._watches_answer()
            if not self.policy.closed:
                self.feed(Tick(at_ns=self.world.now))
            if not any(p.action_id == d.action_id for p in self.pending) and d.action_id not in self.policy.state.asked:
                break  # cancelled by what the Tick decided: its answer is never delivered
        self.world.now = max(self.world.now, done_at)
        self._watches_answer()
        if not self.policy.closed and d.action_id in self.policy.state.asked:
            self.feed(res)

    def _watches_answer(self) -> None:
        """The GPU and router watchers' healthy answers, every WATCH_EVERY of world time, as the runner's poll."""
        while self.last_watch + WATCH_EVERY <= self.world.now and not self.policy.closed:
            self.last_watch += WATCH_EVERY
            if "gpu" not in self.silent:
                self.feed(WatchObserved(at_ns=self.last_watch, source="gpu", data=HEALTHY_GPU))
            if "router" not in self.silent:
                self.feed(WatchObserved(at_ns=self.last_watch, source="router", data={
                    "config_sha256": "router-1", "backend": {"id": "primary", "admitted": self.world.admitted, "inflight": 0}}))

    @initialize(stop_min=st.sampled_from([20, 45, 70]), until_min=st.floats(0, 95), request_s=st.floats(2, 40),
                reuse_on=st.sampled_from([frozenset(), frozenset({"A.reverse_replay"}), frozenset({"B.forward_replay"})]),
                slows=st.one_of(st.none(), st.tuples(st.floats(0.1, 0.9), st.floats(60, 600))),
                host=st.sampled_from(["", "", "", "", "replays", "twin", "outlives"]))
    def a_window_opens_and_runs_for_a_while(self, stop_min: int, until_min: float, request_s: float,
                                            reuse_on: frozenset[str], slows: tuple[float, float] | None,
                                            host: str) -> None:
        # a stop minute near or far, a host as fast or as slow as Hypothesis likes (the plan's rate model
        # says about 7 s a request), whose cache reuses where it likes; the window then runs on a healthy
        # host to a minute Hypothesis picks, so that the rules below meet it anywhere: before the
        # take-down, mid-phase, at the stop minute, in the restore, closed
        plan = plan_builtins(stop_min=stop_min, window_min=stop_min + RESERVE_MIN, restore_reserve_min=RESERVE_MIN)
        self.stop_ns, self.window_ns = int(stop_min * NS_PER_MIN), int((stop_min + RESERVE_MIN) * NS_PER_MIN)
        self.world = World(plan, request_s=request_s, reuse_on=set(reuse_on))
        # a seventh each meet a gateway answering the bodies it answered before, a site whose /metrics is an
        # idle twin's (the engine's counts leave the window's answers out), and a host cache outside the engine,
        # which a load keeps (a fresh incarnation's first request finds it not empty)
        self.world.replays, self.world.counting = host == "replays", host != "twin"
        self.world.outlives = host == "outlives"
        # half the windows meet a host that slows down once the experiment is under way (at this fraction
        # of the stop minute, to this many seconds a request): the phase it began at the old pace then runs
        # into the stop minute, where the invariants must hold (a healthy host's window defers what will
        # not fit, and so ends before it)
        self.slows = None if slows is None else (slows[0] * stop_min, slows[1])
        self._slows_drawn = slows
        self.feed(opened_input(plan))
        self._run_on(100_000, until_ns=int(until_min * NS_PER_MIN))

    # --- rules: what the host and the operator may do, in any order -------------------------------

    @precondition(lambda self: not self.policy.closed)
    @rule(steps=st.integers(1, 400))
    def host_answers_in_order(self, steps: int) -> None:
        self._run_on(steps)

    @precondition(lambda self: len(self.pending) > 1 and not self.policy.closed)
    @rule(pick=st.integers(0, 10**6))
    def host_answers_out_of_order(self, pick: int) -> None:
        self._answer(self.pending.pop(pick % len(self.pending)))

    @precondition(lambda self: not self.policy.closed and self.policy.next_wakeup_ns() is not None)
    @rule(minutes=st.floats(0, 30))
    def clock_moves(self, minutes: float) -> None:
        # as the runner: it sleeps no later than the decider's next wake-up
        wake = self.policy.next_wakeup_ns()
        assert wake is not None
        self.world.now = max(self.world.now, min(wake, self.world.now + int(minutes * 60 * S)))
        self._watches_answer()
        if not self.policy.closed:
            self.feed(Tick(at_ns=self.world.now))

    @precondition(lambda self: not self.policy.closed)
    @rule(data=st.data())
    def the_host_changes_how_it_behaves(self, data: st.DataObject) -> None:
        """Quietly: nothing arrives now; the window meets it in what the host answers next."""
        change = data.draw(st.sampled_from(["fails", "hangs", "slows", "refuses", "restarts", "miscounts", "serves_others",
                                            "overgenerates", "restamps", "replays", "twin", "outlives", "silences"]),
                                  label="change")
        world = self.world
        if change == "fails":  # the next such action fails with this class
            world.fail[data.draw(st.sampled_from(ACTIONS), label="action")] = data.draw(st.sampled_from(FAULT_CLASSES))
        elif change == "hangs":  # the next request's answer comes this much later
            self.hang_s = data.draw(st.floats(30, 900), label="seconds")
        elif change == "slows":  # slower than the estimate learned so far: a round can end past the stop minute
            world.request_s = data.draw(st.floats(30, 900), label="request_s")
        elif change == "refuses":  # the next requests answered 4xx, for what they are
            n, status = data.draw(st.integers(1, 5), label="n"), data.draw(st.sampled_from([400, 413, 422]))
            for k in range(world.requests_sent + 1, world.requests_sent + 1 + n):
                world.request_error[k], world.request_status[k] = "http_error", status
        elif change == "restarts":  # a supervisor restarted the engine under the same incarnation: counters from zero
            world.counters = world._zero()
        elif change == "miscounts":  # its restores fail from now on, and it counts them as reused anyway
            world.miscounts = True
        elif change == "serves_others":  # requests from someone else reach the engine around the router
            world.counters["host_lookups"] += data.draw(st.integers(1, 60), label="requests")
        elif change == "overgenerates":  # the bodies' max_tokens is no longer applied
            world.completion_tokens = data.draw(st.integers(2049, 100_000), label="completion_tokens")
        elif change == "restamps":  # something between the window and the engine now changes every prompt
            world.prompt_tokens = data.draw(st.integers(5001, 6000), label="prompt_tokens")
        elif change == "replays":  # a gateway now answers every body it has answered before from its store
            world.replays = True
        elif change == "twin":  # /metrics is now read from an idle twin of the engine: nothing the window sends moves it
            world.counting = False
        elif change == "outlives":  # the host cache is now a store outside the engine, holding every body
            world.outlives = True
        else:
            self.silent.add(data.draw(st.sampled_from(["gpu", "router"]), label="watch"))

    @precondition(lambda self: not self.policy.closed)
    @rule(data=st.data())
    def an_input_arrives_unbidden(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["watch", "operator_abort", "daemon_restart", "stray", "unasked_request"]))
        now = self.world.now
        if kind == "watch":
            source, payload = data.draw(WATCHES, label="watch")
            self.feed(WatchObserved(at_ns=now, source=source, data=payload))
        elif kind == "operator_abort":
            self.feed(OperatorAbort(at_ns=now, reason="machine"))
        elif kind == "daemon_restart":
            self.pending = []  # what was in flight is lost with the process; the decider re-asks what it may
            self.feed(DaemonRestarted(at_ns=now))
        elif kind == "stray":  # an outcome for an id nobody waits on
            aid = data.draw(st.integers(1, 5000).filter(lambda a: all(p.action_id != a for p in self.pending)))
            ok = data.draw(st.booleans(), label="ok")
            self.feed(ActionDone(at_ns=now, action_id=aid, ok=ok, error=None if ok else "transport"))
        else:
            phase = data.draw(st.sampled_from(["A.forward_prime", "A.reverse_replay"]), label="phase")
            self.feed(RequestDone(at_ns=now, action_id=999_999, phase=phase, order_index=0, body_index=0,
                                  body_sha256="b00", outcome="ok"))

    @precondition(lambda self: self.policy.closed)
    @rule(watch=WATCHES)
    def a_closed_window_hears_more_and_decides_nothing(self, watch: tuple[str, dict]) -> None:
        for inp in (Tick(at_ns=self.world.now + S), WatchObserved(at_ns=self.world.now, source=watch[0], data=watch[1]),
                    OperatorAbort(at_ns=self.world.now, reason="late")):
            self.feed(inp)
            assert self.history[-1][1] == []

    # --- invariants after every step --------------------------------------------------------------

    def teardown(self) -> None:
        event(f"stage {self.policy.state.stage.value}; t0 {'set' if self.t0 is not None else 'unset'}; "
              f"restore {'begun' if self.restore_at is not None else 'not begun'}")
        if self.policy.state.abort is not None:
            event(f"abort {self.policy.state.abort.reason}")
        if self.policy.state.stop_marked:
            event("the stop minute reached")
        if self.replayed_phases:
            event("answers replayed")
        if self.world.warm_incarnations:
            event("a fresh incarnation's cache not empty")
        if self.uncounted_phases - self.replayed_phases:
            event("answers uncounted")
        event(f"slows {'none' if self._slows_drawn is None else 'drawn'}; t0 {'set' if self.t0 is not None else 'unset'}")
        verdicts = [d for _i, ds in self.history for d in ds if isinstance(d, VerdictReached)]
        if verdicts:
            event(f"verdict {verdicts[0].hypothesis}")
        # the same inputs, fed to a fresh decider, give the same decisions: the log replays
        replay = WindowPolicy()
        for inp, ds in self.history:
            assert replay.receive(inp) == ds
        # and reach the same state, as a value: what `log state` prints of a log is what the window held
        assert replay.state == self.policy.state  # the whole state, every field of the frozen value
        held = snapshot(self.policy, len(self.history))
        assert snapshot(replay, len(self.history)) == held
        assert msgspec.json.decode(msgspec.json.encode(held), type=WindowSnapshot) == held
        # the state's cells are exactly the cells the decider recorded, nothing set aside from the log
        assert held.cells == {d.phase: d for _i, ds in self.history for d in ds if isinstance(d, CellRecorded)}


DeciderMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
test_the_decider_keeps_its_invariants_under_any_order_of_observations = DeciderMachine.TestCase
