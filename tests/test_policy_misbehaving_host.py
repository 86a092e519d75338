"""The decider against hosts that misbehave as real engines and supervisors do (contract 4, amended
2026-12-03): unseen restarts, bodies refused wholesale, a restore that would restore half, scaled clocks."""

from __future__ import annotations

from flare_diag.events.schema import (
    AbortDecided, ActionDone, ActionRequested, Alarm, ArmStarted, BoundsScaled, CellRecorded, OperatorAbort, PhaseStarted,
    RestorationRecorded, RestoreStarted, VerdictReached, WatchObserved, WindowClosed,
)
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import World, decisions, drive, plan_builtins


def run(world: World | None = None, hook=None, opened=None):
    w = world or World(plan_builtins())
    return w, drive(WindowPolicy(), w, hook, opened=opened)


def cells(h) -> dict[str, CellRecorded]:
    return {c.phase: c for c in decisions(h, CellRecorded)}


def abort(h) -> AbortDecided | None:
    found = decisions(h, AbortDecided)
    return found[0] if found else None


def restart_after_request(n: int):
    """The engine restarts under the same incarnation once `n` requests were answered: counters at zero."""
    fired = [False]

    def hook(world: World, _history):
        if not fired[0] and world.requests_sent == n:
            fired[0] = True
            world.counters = world._zero()
        return None
    return hook


def _vllm_like(ev):
    import msgspec
    return msgspec.structs.replace(ev, reuse_identity=["gpu_reused_tokens", "host_reused_tokens"])


# --- an engine gone as its identity phase begins ------------------------------------------------

def crash_after_first_load(world: World, _history):
    """The candidate's engine dies as soon as it has loaded: no incarnation, /health 503."""
    if world.incarnations == 1 and world.loaded is not None:
        world.loaded, world.engine_down = None, True
    return None


def test_an_identity_phase_that_finds_no_incarnation_and_no_health_aborts_engine_lost_not_identity_drift():
    _w, h = run(hook=crash_after_first_load)
    a = abort(h)
    assert a is not None and a.reason == "engine_lost", a
    assert a.detail.startswith("A.identity: the identity at the phase's start shows no incarnation loaded")


def test_the_identity_phase_an_abort_cut_says_it_was_cut_during_the_phase_not_that_it_never_started():
    _w, h = run(hook=crash_after_first_load)
    c = cells(h)
    assert c["A.identity"].status == "failed" and c["A.identity"].reason == "window aborted (engine_lost), during this phase"
    assert c["A.forward_prime"].reason == "not started: window aborted (engine_lost)"


# --- a new incarnation of the same recipe that nobody the window asked loaded ------------------

def reloaded_after(phase: str, n: int):
    """After `n` answered requests of `phase`, the engine comes back as a new incarnation of the same recipe
    (a supervisor reloaded it): the incarnation moves, nothing else of the identity does."""
    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == phase)
        if sent >= n and world.loaded is not None and world.loaded["incarnation"] != "i-supervisor":
            world.loaded = {**world.loaded, "incarnation": "i-supervisor"}
        return None
    return hook


def test_an_incarnation_that_moves_mid_phase_with_nothing_else_aborts_engine_restart_not_identity_drift():
    _w, h = run(hook=reloaded_after("A.forward_prime", 10))
    a = abort(h)
    assert a is not None and a.reason == "engine_restart", a
    assert "incarnation: was 'i1', now 'i-supervisor'" in a.detail
    c = cells(h)["A.forward_prime"]
    assert c.status == "invalid" and "the engine restarted during this phase" in c.reason
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"


def test_an_incarnation_that_moves_mid_phase_on_an_engine_whose_labels_carry_none_aborts_engine_restart_at_the_read():
    w = World(plan_builtins())
    w.labels = lambda: {k: v for k, v in World.labels(w).items() if k != "incarnation"}  # vLLM's carry none
    _w, h = run(w, hook=reloaded_after("A.forward_prime", 10))
    a = abort(h)
    assert a.reason == "engine_restart" and a.detail.startswith("A.forward_prime: identity after request")
    assert cells(h)["A.forward_prime"].identity_held is None


def test_an_identity_phase_that_finds_another_incarnation_of_the_loaded_recipe_aborts_engine_restart():
    def hook(world: World, _history):
        if world.incarnations == 1 and world.loaded is not None and world.loaded["incarnation"] == "i1":
            world.loaded = {**world.loaded, "incarnation": "i-supervisor"}
        return None
    _w, h = run(hook=hook)
    a = abort(h)
    assert a is not None and a.reason == "engine_restart" and a.detail.startswith("A.identity: incarnation: expected i1")


def test_counters_that_go_back_with_a_new_incarnation_label_say_a_new_incarnation_not_the_same_one():
    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == "A.forward_prime")
        if sent >= 10 and world.loaded is not None and world.loaded["incarnation"] != "i-supervisor":
            world.loaded = {**world.loaded, "incarnation": "i-supervisor"}
            world.counters = world._zero()
        return None
    _w, h = run(hook=hook)
    a = abort(h)
    assert a.reason == "engine_restart" and "restarted unseen as a new incarnation (i1 -> i-supervisor)" in a.detail
    assert "under the same incarnation" not in a.detail


def test_an_incarnation_that_moves_with_another_field_is_still_identity_drift():
    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == "A.forward_prime")
        if sent >= 10 and not world.identity_override:
            world.loaded = {**world.loaded, "incarnation": "i-other"}
            world.identity_override = {"image": "deadbeef"}
        return None
    _w, h = run(hook=hook)
    assert abort(h).reason == "identity_drift"


def test_an_identity_watch_answer_with_only_a_new_incarnation_aborts_engine_restart():
    from flare_diag.events.schema import WatchObserved as Watched
    fired = [False]

    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == "B.forward_prime")
        if sent == 5 and not fired[0]:
            fired[0] = True
            ident = {**world.identity(), "incarnation": "i-supervisor"}
            return Watched(at_ns=world.now, source="identity", data={"identity": ident, "polled_at_ns": world.now})
        return None
    _w, h = run(hook=hook)
    a = abort(h)
    assert a.reason == "engine_restart" and "identity watch" in a.detail
    assert cells(h)["B.forward_prime"].identity_held is None  # a restart, not a drift of what was verified


def _watch_finds_no_incarnation(health: int | str | None):
    """Mid B.forward_prime, the identity watch reads no incarnation loaded, with the /health it asked then."""
    from flare_diag.events.schema import WatchObserved as Watched
    fired = [False]

    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == "B.forward_prime")
        if sent == 5 and not fired[0]:
            fired[0] = True
            ident = {**world.identity(), "incarnation": None, "recipe_sha256": None}
            data = {"identity": ident, "polled_at_ns": world.now} | ({"health": health} if health is not None else {})
            return Watched(at_ns=world.now, source="identity", data=data)
        return None
    return hook


def test_an_identity_watch_that_finds_no_incarnation_and_health_503_aborts_engine_lost_not_identity_drift():
    _w, h = run(hook=_watch_finds_no_incarnation(503))
    a = abort(h)
    assert a.reason == "engine_lost", a
    assert a.detail == "B.forward_prime: identity watch shows no incarnation loaded and /health answered 503"
    assert cells(h)["B.forward_prime"].identity_held is None  # gone, not drifted


def test_an_identity_watch_that_finds_no_incarnation_and_no_health_answer_aborts_engine_lost_naming_why():
    _w, h = run(hook=_watch_finds_no_incarnation("no connection"))
    a = abort(h)
    assert (a.reason, a.detail.endswith("/health could not be read (no connection)")) == ("engine_lost", True), a


def test_an_identity_watch_that_finds_no_incarnation_while_health_answers_200_is_identity_drift():
    _w, h = run(hook=_watch_finds_no_incarnation(200))
    a = abort(h)
    assert a.reason == "identity_drift" and "incarnation: was" in a.detail, a


def test_an_identity_watch_answer_logged_without_health_is_judged_as_before():
    # logs written before the watch asked /health: the replay corpus's decisions stay as they were
    _w, h = run(hook=_watch_finds_no_incarnation(None))
    assert abort(h).reason == "identity_drift"


# --- a connection to the engine that fails: gone, or only the transport --------------------------

def _request_12_fails(error: str, health: int | str | None):
    """The abort of a window whose 12th request fails with `error`, /health then answering `health`."""
    w = World(plan_builtins())
    w.request_error[12] = error
    if health is not None:
        w.request_health[12] = health
    _w, h = run(w)
    return abort(h)

def test_a_request_that_fails_in_transport_with_health_unreadable_after_it_aborts_engine_lost():
    a = _request_12_fails("transport", "no connection")
    assert a.reason == "engine_lost", a
    assert a.detail.startswith("A.forward_prime #11 (action ") and a.detail.endswith(
        ": injected transport; /health then could not be read (no connection)"), a.detail


def test_a_read_of_the_engine_that_fails_in_transport_with_health_503_after_it_aborts_engine_lost():
    w = World(plan_builtins())
    w.fail["read_identity"], w.fail_health["read_identity"] = "transport", 503
    _w, h = run(w)
    a = abort(h)
    assert a.reason == "engine_lost" and a.detail.endswith("; /health then answered 503"), a


def test_a_transport_failure_with_the_engine_healthy_after_it_is_still_malformed_transport():
    assert _request_12_fails("transport", 200).reason == "malformed_transport"


def test_a_transport_failure_logged_before_health_was_asked_after_it_is_judged_as_before():
    assert _request_12_fails("transport", None).reason == "malformed_transport"


# --- an engine that holds its work and gives nothing ---------------------------------------------

def test_a_stalled_request_with_the_engine_healthy_after_it_aborts_engine_stalled_naming_its_health():
    a = _request_12_fails("stalled", 200)
    assert a.reason == "engine_stalled", a
    assert a.detail.startswith("A.forward_prime #11 (action ") and a.detail.endswith(
        ": injected stalled; /health then answered 200"), a.detail


def test_a_stalled_request_with_health_unreadable_after_it_aborts_engine_lost():
    a = _request_12_fails("stalled", "timeout")
    assert a.reason == "engine_lost" and a.detail.endswith("; /health then could not be read (timeout)"), a


def test_a_read_of_the_engine_that_times_out_with_health_unreadable_after_it_aborts_engine_lost():
    w = World(plan_builtins())
    w.fail["scrape_metrics"], w.fail_health["scrape_metrics"] = "timeout", "timeout"
    _w, h = run(w)
    a = abort(h)
    assert a.reason == "engine_lost" and a.detail.endswith(": injected timeout; /health then could not be read (timeout)"), a


def test_a_read_of_the_engine_that_times_out_with_the_engine_healthy_after_it_aborts_nothing():
    w = World(plan_builtins())
    w.fail["scrape_metrics"], w.fail_health["scrape_metrics"] = "timeout", 200
    _w, h = run(w)
    assert abort(h) is None, "a slow read alone is no abort"


def test_a_closing_drain_whose_scrapes_get_no_answer_says_so_in_its_cell_not_only_that_it_did_not_settle():
    def hook(world: World, history):
        sent = sum(1 for i, _ds in history if type(i).__name__ == "RequestDone" and i.phase == "A.forward_prime")
        closed = any(type(d).__name__ == "CellRecorded" and d.phase == "A.forward_prime" for _i, ds in history for d in ds)
        if sent == 52 and not closed:  # every scrape of its closing drain, /health 200 after each
            world.fail["scrape_metrics"], world.fail_health["scrape_metrics"] = "timeout", 200
        return None
    _w, h = run(hook=hook)
    prime = cells(h)["A.forward_prime"]
    assert prime.status == "invalid" and prime.reason.startswith("drain after the phase did not settle within 10 s ("), prime
    assert prime.reason.endswith(" scrapes got no answer: injected timeout)"), prime.reason


# --- answers from a model the window did not verify ---------------------------------------------

def _served(world: World) -> World:
    """Answers that name the model they came from, as vLLM's do: the identity's model, asked by name."""
    served = world.identity()["model"]
    world.models = (served, served)
    return world


def test_an_answer_naming_another_model_than_the_verified_identity_aborts_identity_drift_naming_the_request():
    w = _served(World(plan_builtins()))
    w.answered_as = {60: "another-model"}  # the 60th request sent: past the first identity phase
    _w, h = run(w)
    a = abort(h)
    assert a is not None and a.reason == "identity_drift"
    assert "was answered as model 'another-model', not" in a.detail and a.detail.split(":")[0] in cells(h)
    assert cells(h)[a.detail.split(":")[0]].status == "invalid"


def test_an_answer_naming_the_model_its_body_asked_for_is_no_drift():
    w = _served(World(plan_builtins()))
    w.models = ("adapter-a", "adapter-a")  # a body that names a LoRA adapter: vLLM answers with its name
    _w, h = run(w)
    assert abort(h) is None and all(c.status == "measured" for c in cells(h).values() if c.phase.startswith("A."))


def test_answers_of_an_engine_that_names_no_serving_model_are_not_held_to_the_identity():
    w = World(plan_builtins())  # ("", ""): what the adapters record of answers that witness nothing
    w.answered_as = {60: ""}
    _w, h = run(w)
    assert abort(h) is None


# --- reuse that the engine's own per-request figures contradict --------------------------------

def test_counters_that_per_request_cached_tokens_contradict_make_the_cell_invalid_and_name_the_figures():
    w = World(plan_builtins())
    w.cached_tokens = 0  # the engine says it reused nothing; its counters say 256 a request
    _w, h = run(w, opened=_vllm_like)
    c = cells(h)["A.forward_prime"]
    assert c.status == "invalid" and "disagree on" in c.reason and "counters 256, cached_tokens 0" in c.reason


def test_contradicted_reuse_names_no_cause():
    w = World(plan_builtins())
    w.cached_tokens = 0
    _w, h = run(w, opened=_vllm_like)
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"


def test_counters_that_per_request_cached_tokens_confirm_are_measured():
    w = World(plan_builtins())
    w.cached_tokens = "true"
    _w, h = run(w, opened=_vllm_like)
    got = cells(h)
    assert {got[p].status for p in ("A.forward_prime", "A.reverse_replay", "B.forward_prime", "B.forward_replay")} == {"measured"}


def test_an_engine_that_states_no_reuse_identity_is_not_cross_checked():
    w = World(plan_builtins())
    w.cached_tokens = 0
    _w, h = run(w)
    assert cells(h)["A.forward_prime"].status == "measured"


# --- unseen restarts ---------------------------------------------------------------------------

def test_a_counter_that_goes_back_aborts_engine_restart():
    _w, h = run(hook=restart_after_request(5))
    a = abort(h)
    assert a is not None and a.reason == "engine_restart" and "finished went from 4 to 0" in a.detail


def test_the_phase_an_unseen_restart_falls_in_is_invalid_and_says_so():
    _w, h = run(hook=restart_after_request(5))
    c = cells(h)["A.forward_prime"]
    assert c.status == "invalid" and "the engine restarted during this phase" in c.reason


def test_an_unseen_restart_names_no_cause_even_with_the_order_probe_measured():
    # A's prime and reverse replay are measured (52 + 52 requests); the restart falls in B's prime
    _w, h = run(hook=restart_after_request(52 * 2 + 3))
    assert cells(h)["A.reverse_replay"].status == "measured"
    v = decisions(h, VerdictReached)[0]
    assert v.hypothesis == "inconclusive" and "engine restarted" in v.basis


def test_a_process_start_time_that_moves_is_a_restart_with_every_counter_at_zero():
    w = World(plan_builtins())
    w.gauges["process_start_time"] = 1000.0
    fired = [False]

    def hook(world: World, history):
        # B is loaded and its identity verified (counters at zero), and B's prime has not sent a request
        if not fired[0] and any(isinstance(d, CellRecorded) and d.phase == "B.identity" for _i, ds in history for d in ds):
            fired[0] = True
            world.gauges["process_start_time"] = 2000.0
        return None
    _w, h = run(w, hook)
    a = abort(h)
    assert a is not None and a.reason == "engine_restart" and "process start time moved" in a.detail
    assert cells(h)["B.forward_prime"].status == "invalid"


def test_counters_that_start_over_on_a_load_the_window_asked_for_are_no_restart():
    w = World(plan_builtins())
    w.gauges["process_start_time"] = 1000.0
    _w, h = run(w)  # World's loads zero the counters; its start time is one value throughout
    assert abort(h) is None and decisions(h, WindowClosed)[-1].outcome == "completed"


def test_a_restart_during_the_restore_starts_the_restore_over():
    w = World(plan_builtins())
    w.gauges["process_start_time"] = 1000.0
    fired = [False]

    def hook(world: World, history):
        if fired[0]:
            return None
        flat = [d for _i, ds in history for d in ds]
        start = next((i for i, d in enumerate(flat) if isinstance(d, RestoreStarted)), None)
        first = next((d.action_id for d in flat[start or 0:] if isinstance(d, ActionRequested)
                      and d.action == "scrape_metrics"), None) if start is not None else None
        # once the restored incumbent's first scrape is answered: the next one meets a restarted engine
        if first is not None and any(isinstance(i, ActionDone) and i.action_id == first for i, _ds in history):
            fired[0] = True
            world.gauges["process_start_time"] = 3000.0
        return None
    # a window that completed its cells: the restart is met only by the restore
    _w, h = run(w, hook)
    flat = decisions(h)
    start = next(i for i, d in enumerate(flat) if isinstance(d, RestoreStarted))
    states = [d for d in flat[start:] if isinstance(d, ActionRequested) and d.action == "manager_state"]
    assert len(states) == 2, "the restore did not start over from its first check"
    assert [a for a in decisions(h, Alarm) if a.kind == "engine_restart_during_restore"]
    assert abort(h).reason == "engine_restart"
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"
    assert decisions(h, RestorationRecorded)[0].verified
    assert decisions(h, WindowClosed)[-1].outcome == "aborted"


# --- bodies refused wholesale ------------------------------------------------------------------

def refusing(statuses: dict[int, int]) -> World:
    w = World(plan_builtins())
    for n, status in statuses.items():
        w.request_error[n] = f"http_{status}"
        w.request_status[n] = status
    return w


def test_a_host_that_refuses_every_body_aborts_rejected_within_the_streak():
    w = refusing({n: 400 for n in range(1, 300)})
    _w, h = run(w)
    a = abort(h)
    assert a is not None and a.reason == "rejected"
    assert "HTTP 400" in a.detail and "A.forward_prime #0" in a.detail and "injected http_400" in a.detail
    sent = [d for d in decisions(h, ActionRequested) if d.action == "send_request"]
    assert len(sent) == 3  # the plan's default streak, at C1: no fourth body goes out
    assert not [d for d in decisions(h, ActionRequested) if d.action == "load" and d.args.get("label") == "B"]
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"
    assert decisions(h, RestorationRecorded)[0].verified


def test_one_refused_body_among_52_fails_its_request_and_the_phase_goes_on():
    _w, h = run(refusing({7: 400}))
    assert abort(h) is None
    c = cells(h)["A.forward_prime"]
    assert c.status == "failed" and "1 of 52 requests failed" in c.reason and c.requests == 52
    # the window goes on: the replay that reads this prime is invalid for it, the B arm runs
    assert cells(h)["A.reverse_replay"].status == "invalid" and "its prime A.forward_prime" in cells(h)["A.reverse_replay"].reason
    assert cells(h)["B.forward_replay"].status == "measured"


def test_refusals_broken_by_an_answered_request_never_reach_the_streak():
    _w, h = run(refusing({1: 400, 2: 422, 4: 400, 5: 400}))
    assert abort(h) is None


def test_credential_and_load_refusals_do_not_count_towards_the_streak():
    # 401 and 403 are the credential's (authentication aborts on its own class), 429 is the host's load
    _w, h = run(refusing({1: 429, 2: 429, 3: 429, 4: 429}))
    assert abort(h) is None


def test_the_streak_is_the_plans():
    plan = plan_builtins()
    plan["abort"] = {"rejected_streak": 5}
    w = World(plan)
    for n in range(1, 300):
        w.request_error[n], w.request_status[n] = "http_400", 400
    _w, h = run(w)
    assert abort(h).reason == "rejected"
    assert len([d for d in decisions(h, ActionRequested) if d.action == "send_request"]) == 5


# --- a candidate load that fails ----------------------------------------------------------------

def candidate_loads(h) -> list[str]:
    return [d.args["label"] for d in decisions(h, ActionRequested) if d.action == "load" and d.args["label"] != "incumbent"]


def test_a_candidate_load_that_got_no_answer_is_followed_by_a_look_at_the_manager_before_the_next_load():
    w = World(plan_builtins())
    w.fail["load:A"] = "timeout"
    _w, h = run(w)
    acts = [(d.action, d.args.get("label")) for d in decisions(h, ActionRequested) if d.action in ("load", "manager_state")]
    assert acts[acts.index(("load", "A")):][:3] == [("load", "A"), ("manager_state", None), ("load", "B")], acts
    assert cells(h)["B.forward_replay"].status == "measured"


def test_a_manager_still_busy_after_a_load_that_got_no_answer_gets_no_later_candidate_load():
    w = World(plan_builtins())
    w.fail["load:A"] = "timeout"

    def still_starting(world: World, history):
        if "A" in candidate_loads(history):  # the engine A's load started is still starting
            world.manager_busy = True
        return None
    _w, h = run(w, still_starting)
    assert candidate_loads(h) == ["A"]
    c = cells(h)["B.forward_replay"]
    assert c.status == "failed" and c.reason == (
        "not started: the candidate's load as incarnation A got no answer within its deadline, and the "
        "manager then showed a load or unload still running: no later arm loads the candidate")
    assert decisions(h, RestorationRecorded)[0].verified and decisions(h, WindowClosed)[-1].outcome == "partial"


def test_a_candidate_load_the_host_refused_is_followed_by_the_next_arms_load():
    w = World(plan_builtins())
    w.fail["load:A"] = "load_failed"  # answered: the host saw it fail, and nothing is left loading
    _w, h = run(w)
    assert candidate_loads(h) == ["A", "B"]
    assert cells(h)["B.forward_replay"].status == "measured"


class FailingLoadOfA(World):
    """A's load fails after `failed_after_s` (900: an engine not healthy within the manager's own bound)."""

    def __init__(self, plan: dict, failed_after_s: float) -> None:
        super().__init__(plan)
        self.failed_after_s = failed_after_s

    def answer(self, d: ActionRequested):
        if d.action == "load" and d.args.get("label") == "A":
            self.now += int(self.failed_after_s * 1e9)
            return ActionDone(at_ns=self.now, action_id=d.action_id, ok=False, error="load_failed",
                              detail=f"engine was not healthy within {self.failed_after_s:g} s")
        return super().answer(d)


def b_arm_minutes(failed_after_s: float) -> float:
    """How long arm B was estimated to take when it started, after A's load failed in `failed_after_s`."""
    _w, h = run(FailingLoadOfA(plan_builtins(), failed_after_s))
    b = next(a for a in decisions(h, ArmStarted) if a.arm == "B")
    return b.estimated_end_minute - b.minute


def test_the_next_arm_is_fitted_to_a_load_that_failed_slowly():
    # World's loads take 60 s: B's estimate carries the 900 s the failed one took, not a load's usual time
    assert b_arm_minutes(900) - b_arm_minutes(1) >= (900 - 60) / 60 - 0.1


class LateLoads(World):
    """Loads of `label` that get no answer within their deadline, and have loaded all the same."""

    def __init__(self, plan: dict, label: str) -> None:
        super().__init__(plan)
        self.late_label = label

    def answer(self, d: ActionRequested):
        done = super().answer(d)
        if d.action in ("load", "unload") and d.args.get("label") == self.late_label:
            return ActionDone(at_ns=self.now, action_id=d.action_id, ok=False, error="timeout",
                              detail=f"{d.action}: no answer within its deadline of 600 s")
        return done


def test_an_incumbent_load_that_got_no_answer_but_loaded_is_not_loaded_again():
    _w, h = run(LateLoads(plan_builtins(), "incumbent"))
    acts = [d.action for d in decisions(h, ActionRequested) if d.action in ("load", "manager_state")]
    restore = acts[acts.index("manager_state"):]  # from the restore's first look at the manager
    assert restore[:3] == ["manager_state", "load", "manager_state"] and restore.count("load") == 1, restore
    assert decisions(h, RestorationRecorded)[0].verified


def test_an_incumbent_load_that_got_no_answer_and_loaded_nothing_is_tried_again():
    w = World(plan_builtins())
    w.fail["load:incumbent"] = "timeout"  # once: the second attempt loads
    _w, h = run(w)
    loads = [d.args["label"] for d in decisions(h, ActionRequested) if d.action == "load"]
    assert loads.count("incumbent") == 2 and decisions(h, RestorationRecorded)[0].verified


def with_arm_c(plan: dict) -> dict:
    """The plan with a third loading arm: a fresh incarnation C's identity phase, after B's."""
    b = next(i for i, ph in enumerate(plan["phases"]) if ph["id"] == "B.identity")
    c = {**plan["phases"][b], "id": "C.identity", "incarnation": "C", "optional": True}
    return {**plan, "phases": [*plan["phases"], c]}


def test_a_candidate_unload_that_got_no_answer_is_not_sent_again_and_no_later_arm_loads():
    fired = [False]

    def unload_hangs_once_a_is_up(world: World, _history):
        if not fired[0] and world.incarnations == 1:  # A loaded: the next unload is A's, before B
            fired[0] = True
            world.fail["unload"] = "timeout"
        return None
    _w, h = run(World(with_arm_c(plan_builtins())), unload_hangs_once_a_is_up)
    acts = [(d.action, d.args.get("label")) for d in decisions(h, ActionRequested) if d.action in ("load", "unload")]
    assert acts[:4] == [("unload", None), ("load", "A"), ("unload", None), ("unload", None)], acts  # the 4th: the restore's
    assert ("load", "C") not in acts and ("load", "B") not in acts
    c = cells(h)["C.identity"]
    assert c.status == "failed" and c.reason.startswith("not started: the candidate's unload as incarnation A got no answer")
    assert c.reason.endswith("and the manager then showed glm-candidate loaded: no later arm loads the candidate")


def test_a_manager_busy_before_the_window_aborts_preflight_with_nothing_taken_down():
    w = World(plan_builtins())
    w.manager_busy = True  # someone else's load or unload is running
    _w, h = run(w)
    a = abort(h)
    assert a is not None and a.reason == "preflight" and "in progress (busy)" in a.detail, a
    assert not [d for d in decisions(h, ActionRequested) if d.action in ("quiesce", "unload", "load")]
    assert decisions(h, WindowClosed)[-1].outcome == "aborted"


# --- the restore's last drain says what it saw ---------------------------------------------------

def once_restoring(change):
    """From the restore's first decision on, `change(world)` before every answer."""
    def hook(world: World, history):
        if any(isinstance(d, RestoreStarted) for _i, ds in history for d in ds):
            change(world)
        return None
    return hook


def fault_during_restore(h) -> str:
    return next(a.detail for a in decisions(h, Alarm) if a.kind == "fault_during_restore")


def test_a_restore_drain_held_by_moving_counters_names_them_not_a_busy_engine():
    def tick(world: World):
        world.counters["finished"] += 1
    _w, h = run(hook=once_restoring(tick))
    said = fault_during_restore(h)
    assert "every drain gauge at zero, but finished still changed between scrapes" in said, said
    assert "not idle" not in said and decisions(h, WindowClosed)[-1].outcome == "restore_failed"


def test_a_restore_drain_held_by_a_gauge_the_engine_stopped_exporting_names_the_gauge():
    def drop(world: World):
        world.gauges.pop("host_transfers_waiting", None)
    _w, h = run(hook=once_restoring(drop))
    said = fault_during_restore(h)
    assert "(its metrics do not carry host_transfers_waiting)" in said, said


def test_a_restore_drain_held_by_a_busy_gauge_names_the_value_the_gates_scrape_showed():
    def busy(world: World):
        world.gauges["requests_pending"] = 7
    _w, h = run(hook=once_restoring(busy))
    assert "with no request of the window in flight (requests_pending = 7)" in fault_during_restore(h)


# --- a restore that restores everything --------------------------------------------------------

TRACE_ON = "trace.C1.r1.on"


def _trace_on_actions() -> list[int]:
    """The action ids of the first trace-on arm, from its trace toggle to its cell."""
    _w, h = run()
    flat = decisions(h)
    start = next(i for i, d in enumerate(flat) if isinstance(d, PhaseStarted) and d.phase == TRACE_ON)
    end = next(i for i, d in enumerate(flat) if isinstance(d, CellRecorded) and d.phase == TRACE_ON)
    return [d.action_id for d in flat[start:end] if isinstance(d, ActionRequested)]


def _abort_at(action_id: int):
    fired = [False]

    def hook(world: World, history):
        asked = any(isinstance(d, ActionRequested) and d.action_id == action_id for _i, ds in history for d in ds)
        if not fired[0] and asked:
            fired[0] = True
            return OperatorAbort(at_ns=world.now, reason=f"abort at action {action_id}")
        return None
    return hook


def test_an_abort_at_every_action_of_a_trace_on_arm_restores_every_field_of_the_identity():
    ids = _trace_on_actions()
    assert len(ids) > 20  # its toggle, drains, 8 requests with their reads, its closing reads
    before = World(plan_builtins()).identity()
    for aid in ids:
        w, h = run(hook=_abort_at(aid))  # World's trace switch survives a load, as some hosts' does
        res = decisions(h, RestorationRecorded)[0]
        assert res.verified and res.checks["identity_restored"] is True, (aid, res.checks)
        now = w.identity()
        assert {k: v for k, v in now.items() if k != "incarnation"} == \
               {k: v for k, v in before.items() if k != "incarnation"}, aid


def test_a_trace_left_on_is_set_back_by_the_restore():
    ids = _trace_on_actions()
    w, h = run(hook=_abort_at(ids[len(ids) // 2]))
    flat = decisions(h)
    start = next(i for i, d in enumerate(flat) if isinstance(d, RestoreStarted))
    toggles = [d.args for d in flat[start:] if isinstance(d, ActionRequested) and d.action == "set_trace"]
    assert toggles == [{"enabled": False}] and w.trace is False


def test_a_field_not_back_after_the_readmit_leaves_the_restoration_unverified():
    readmitted = [False]

    def hook(world: World, history):
        last = history[-1][1] if history else []
        if not readmitted[0] and any(isinstance(d, ActionRequested) and d.action == "readmit" for d in last):
            readmitted[0] = True
            world.identity_override = {"capture_enabled": True}  # something left the capture on
        return None
    _w, h = run(hook=hook)
    res = decisions(h, RestorationRecorded)[0]
    assert res.checks["identity_restored"] is False and not res.verified
    assert [a for a in decisions(h, Alarm) if a.kind == "identity_not_restored" and "capture_enabled" in a.detail]
    assert decisions(h, WindowClosed)[-1].outcome == "restore_failed"


def test_a_gpu_memory_breach_while_the_incumbent_loads_keeps_the_primary_out():
    fired = [False]

    def hook(world: World, history):
        last = history[-1][1] if history else []
        loading = any(isinstance(d, ActionRequested) and d.action == "load" and d.args.get("label") == "incumbent"
                      for d in last)
        if not fired[0] and loading:
            fired[0] = True
            return WatchObserved(at_ns=world.now, source="gpu", data={"xid_events": [], "gpus": [
                {"uuid": "GPU-0", "memory_used_bytes": 999, "memory_total_bytes": 1000}]})
        return None
    _w, h = run(hook=hook)
    res = decisions(h, RestorationRecorded)[0]
    assert res.checks["readmitted"] is False and not res.verified
    assert not [d for d in decisions(h, ActionRequested) if d.action == "readmit"]
    assert decisions(h, WindowClosed)[-1].outcome == "restore_failed"


def test_a_gpu_memory_breach_while_the_candidate_is_still_loaded_does_not_block_the_restore():
    """The candidate's own breach is what the experiment aborted for; the restore unloads it first."""
    w = World(plan_builtins())
    hit = [0]

    def hook(world: World, history):
        if hit[0] == 0 and world.requests_sent == 10:
            hit[0] = 1
            return WatchObserved(at_ns=world.now, source="gpu", data={"xid_events": [], "gpus": [
                {"uuid": "GPU-0", "memory_used_bytes": 999, "memory_total_bytes": 1000}]})
        return None
    _w, h = run(w, hook)
    assert abort(h).reason == "uncontrolled_growth"
    assert decisions(h, RestorationRecorded)[0].verified


# --- scaled clocks -----------------------------------------------------------------------------

def _scaled(scale: float):
    return lambda first: first.__class__(**{**{f: getattr(first, f) for f in first.__struct_fields__},
                                            "time_scale": scale})


def test_bounds_a_real_seconds_floor_raises_are_recorded_as_the_window_opens():
    _w, h = run(opened=_scaled(60))
    raised = {b["bound"]: b for b in decisions(h, BoundsScaled)[0].bounds}
    assert raised["timing.watch_lost_s"]["plan_s"] == 30 and raised["timing.watch_lost_s"]["effective_s"] == 300
    assert raised["timing.drain_timeout_s"]["effective_s"] == 300
    assert "drains were allowed 300 window s" in cells(h)["A.forward_prime"].reason


def test_at_x6_every_bound_holds_as_planned_but_the_drains():
    _w, h = run(opened=_scaled(6))
    raised = {b["bound"] for d in decisions(h, BoundsScaled) for b in d.bounds}
    assert "timing.watch_lost_s" not in raised and "timing.drain_timeout_s" in raised


def test_a_window_at_x1_records_no_scaled_bound():
    _w, h = run()
    assert decisions(h, BoundsScaled) == []


def test_at_x6_a_silent_gpu_view_aborts_watch_lost_within_the_plans_30_window_seconds():
    w = World(plan_builtins())
    silent_at = [None]

    def hook(world: World, history):
        if silent_at[0] is None and world.requests_sent == 5:
            silent_at[0] = world.now
            world.watch_silent.add("gpu")
        return None
    _w, h = run(w, hook, opened=_scaled(6))
    flat = [(i, d) for i, ds in h for d in ds]
    a = next((i, d) for i, d in flat if isinstance(d, AbortDecided))
    assert a[1].reason == "watch_lost"
    # the last answer came at most one poll (5 s) before the silence: the abort within 30 + 5 s of it
    assert a[0].at_ns - silent_at[0] <= (30 + 5) * 10**9 + 10**6


def test_outcomes_of_unexpected_actions_change_nothing():
    """An ActionDone nobody waits for (a stale reply) never moves the window."""
    _w, h = run(hook=lambda world, history: ActionDone(at_ns=world.now, action_id=10**6, ok=True,
                                                        data={"counters": {"host_lookups": -1}})
                if world.requests_sent == 3 and not getattr(world, "_stale", None) and not setattr(world, "_stale", 1)
                else None)
    assert abort(h) is None


# --- the decider's one promise, over random hosts ----------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

REQUIRED_REQUESTS = 4 * 52  # A's prime and reverse replay, B's prime and forward replay, at C1


def _misbehaving(kind: str, n: int):
    """A hook that makes the host misbehave as `kind` from its n-th answered request on."""
    fired = [False]

    def hook(world: World, _history):
        if fired[0] or world.requests_sent < n:
            return None
        fired[0] = True
        if kind == "restart":  # what an engine's restart does: counters at zero, a new process
            world.counters = world._zero()
            world.gauges["process_start_time"] = 2.0
        elif kind == "counters_only":  # an engine that exports no start time
            world.counters = world._zero()
        elif kind == "start_time":
            world.gauges["process_start_time"] = 2.0
        elif kind == "drift":
            world.identity_override = {"draft_tokens": 3}
        elif kind == "refuse":
            for k in range(n + 1, n + 400):
                world.request_error[k], world.request_status[k] = "http_400", 400
        return None
    return hook


# a restart right after an incarnation's first request, before any scrape saw a counter above zero,
# leaves its counters where they were (0 -> 0): without a process start time nothing shows it
FIRST_ON_AN_INCARNATION = (1, 2 * 52 + 1)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["restart", "counters_only", "start_time", "drift", "refuse"]),
       n=st.integers(1, REQUIRED_REQUESTS - 1))
def test_a_counter_decrease_identity_change_or_refusal_among_the_required_cells_never_names_a_cause(kind, n):
    if kind == "counters_only" and n in FIRST_ON_AN_INCARNATION:
        n += 1
    w = World(plan_builtins())
    w.gauges["process_start_time"] = 1.0
    _w, h = run(w, _misbehaving(kind, n))
    v = decisions(h, VerdictReached)[0]
    assert v.hypothesis == "inconclusive", (kind, n, v.basis)
    # this world's drift is the host's, not the incarnation's: the restored incumbent shows it too,
    # and the restore must then refuse to call itself verified
    assert decisions(h, RestorationRecorded)[0].verified is (kind != "drift")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reuse=st.sets(st.sampled_from(["A.reverse_replay", "B.forward_replay", "B.small_control"])),
       request_s=st.floats(2.0, 16.0))
def test_a_healthy_host_still_gets_a_cause(reuse, request_s):
    w = World(plan_builtins(), request_s=request_s, reuse_on=set(reuse))
    w.gauges["process_start_time"] = 1.0
    _w, h = run(w)
    assert abort(h) is None and decisions(h, WindowClosed)[-1].outcome == "completed"
    assert decisions(h, VerdictReached)[0].hypothesis != "inconclusive"


# --- the next step agrees with the figures it cites ------------------------------------------------

def _cells(rev_host: dict, fwd_reused: int | None = 0) -> dict:
    measured = {"status": "measured", "incarnation_id": "a"}
    out = {"A.forward_prime": measured, "A.reverse_replay": {**measured, "host": rev_host},
           "B.forward_prime": {**measured, "incarnation_id": "b"}}
    if fwd_reused is not None:
        out["B.forward_replay"] = {**measured, "incarnation_id": "b", "host": {"reused_tokens": fwd_reused}}
    return out


def test_a_fetch_that_restored_but_went_unused_is_never_called_a_restore_that_did_not_happen():
    from flare_diag.policies.interpret import verdict
    hyp, basis, nxt = verdict(_cells({"lookups": 52, "hits": 40, "fetched_tokens": 9000, "reused_tokens": 0}))
    assert hyp == "key_or_checkpoint_eligibility" and "9000 tokens fetched" in basis
    assert "did not restore" not in nxt and "fetched 9000 host tokens but prefill reused none" in nxt


def test_unobservable_host_reuse_is_never_called_an_unmeasured_replay():
    from flare_diag.policies.interpret import verdict
    hyp, basis, nxt = verdict(_cells({"lookups": None, "hits": None, "fetched_tokens": None, "reused_tokens": None}))
    assert hyp == "inconclusive" and "not observable" in basis
    assert "was not measured" not in nxt and "does not expose" in nxt


def test_a_log_that_fails_as_the_quiesce_is_decided_restores_without_calling_the_admitted_primary_a_breach():
    """The log refused the quiesce's decision, so the runner never sent it (`not_carried_out`): the
    primary stayed in rotation; the restore verifies and says nothing was left quiesced (a CI run on a
    disk that filled at that moment closed restore_failed, 'primary_left_quiesced', on an admitted primary)."""
    from flare_diag.events.schema import ActionRequested, Alarm, LogUnwritable, RestorationRecorded, WindowClosed
    from flare_diag.policies.window import WindowPolicy
    from tests.policy_world import World, drive, plan_builtins

    world = World(plan_builtins())
    sent: list[bool] = []

    def hook(w, history):
        if sent or not history or not any(isinstance(d, ActionRequested) and d.action == "quiesce" for d in history[-1][1]):
            return None
        sent.append(True)
        w.fail["quiesce"] = "not_carried_out"
        return LogUnwritable(at_ns=w.now, detail="disk full")

    history = drive(WindowPolicy(), world, hook)
    decided = [d for _i, ds in history for d in ds]
    closed = [d for d in decided if isinstance(d, WindowClosed)][-1]
    restoration = [d for d in decided if isinstance(d, RestorationRecorded)][-1]
    assert sent and closed.outcome == "aborted", closed
    assert restoration.verified and restoration.checks["readmitted"] is None, restoration
    assert not [d for d in decided if isinstance(d, Alarm) and d.kind in ("primary_left_quiesced", "fault_during_restore")]


def test_a_fresh_incarnation_whose_first_request_finds_the_host_cache_warm_measures_nothing_on_it_and_names_no_cause():
    """A host cache that outlives the engine (an external KV store its occupancy gauges do not see) holds A's
    entries when B loads: B's cold prime finds them from its first request. Its forward replay then reuses
    what A left, and the window named `not_reproduced` on a comparison the method does not make."""
    w = World(plan_builtins(), reuse_on={"A.reverse_replay", "B.forward_prime", "B.forward_replay"})
    _w, h = run(w)
    c = cells(h)
    assert c["B.forward_prime"].status == "invalid"
    assert "incarnation B, verified fresh, was not empty: its first request found" in c["B.forward_prime"].reason
    assert "#0: 1 host hits, 1,000 tokens reused" in c["B.forward_prime"].reason
    assert c["B.forward_replay"].status == "invalid"
    assert c["B.forward_replay"].reason.startswith("incarnation B not verified fresh: B.forward_prime's first request found")
    assert decisions(h, VerdictReached)[-1].hypothesis == "inconclusive"
    assert c["A.forward_prime"].status == "measured" and abort(h) is None


def test_a_cold_prime_whose_first_request_finds_the_cache_warm_sends_no_more_of_its_requests():
    """Nothing more on that incarnation can be measured: the primary's time is not spent on the other 51."""
    w = World(plan_builtins(), reuse_on={"A.reverse_replay", "B.forward_prime", "B.forward_replay"})
    h = run(w)[1]
    sent = [d for d in decisions(h, ActionRequested) if d.action == "send_request" and d.args["phase"] == "B.forward_prime"]
    assert len(sent) == 1
    c = cells(h)["B.forward_prime"]
    assert (c.status, c.requests) == ("invalid", 1) and c.reason.endswith("(the phase stopped at that request)")


def _warm_up_at_load() -> World:
    """Each candidate incarnation comes up having answered its own warm-up request (SGLang's), counted as any is."""
    w = World(plan_builtins())
    orig = w.answer

    def answer(d):
        r = orig(d)
        if d.action == "load" and d.args.get("label") in ("A", "B"):
            w.counters.update(finished=1, generation_tokens=8)
        return r
    w.answer = answer
    return w


def _sglang_like(ev):
    import msgspec
    return msgspec.structs.replace(ev, startup_requests=16, startup_generated_each=8)


def test_a_fresh_incarnation_showing_only_its_engines_own_warm_up_is_verified_fresh_and_says_so():
    h = run(_warm_up_at_load(), opened=_sglang_like)[1]
    c = cells(h)
    assert c["A.identity"].status == c["B.identity"].status == "measured"
    assert "; counters reset (but for 1 start-up request of the engine's own: 0 prompt, 8 generated tokens) and empty " \
        "host cache verified" in c["A.identity"].reason
    assert c["B.forward_replay"].status == "measured" and abort(h) is None


def test_a_warm_up_is_not_forgiven_on_an_engine_that_sends_itself_none():
    c = cells(run(_warm_up_at_load())[1])
    assert c["A.identity"].status == "invalid" and "counters not reset (finished, generation_tokens)" in c["A.identity"].reason


def test_a_first_request_that_a_kv_connector_finds_in_its_store_leaves_the_fresh_incarnation_unmeasured():
    """vLLM's connector store (LMCache's server, Mooncake, a shared directory) outlives the engine; vLLM maps no
    host reuse, but counts what the connector found in its store as it schedules the request."""
    w = World(plan_builtins(), reuse_on={"A.reverse_replay"})
    orig = w.answer

    def answer(d):
        if d.action == "send_request" and d.args["phase"] == "B.forward_prime" and d.args["order_index"] == 0:
            w.counters["external_found_tokens"] = 480
        r = orig(d)
        w.counters.setdefault("external_found_tokens", 0)  # exported from the start, as vLLM's is
        return r
    w.answer = answer
    c = cells(run(w)[1])
    assert c["B.forward_prime"].status == "invalid" and c["B.forward_prime"].requests == 1
    assert "(#0: 0 host hits, 0 tokens reused, 480 tokens found in a cache outside the engine)" in c["B.forward_prime"].reason
    assert c["B.forward_replay"].not_fresh


def test_cells_on_an_incarnation_whose_cache_was_warm_are_marked_not_fresh_and_no_others():
    w = World(plan_builtins(), reuse_on={"A.reverse_replay", "B.forward_prime", "B.forward_replay"})
    c = cells(run(w)[1])
    assert {p for p, cell in c.items() if cell.not_fresh} == {"B.forward_prime", "B.forward_replay", "B.small_control"}


def test_a_b_arm_whose_first_request_found_the_cache_warm_asks_for_a_cold_start_before_it_runs_again():
    """Another B on the same host would meet the same store: the next step says to empty it first."""
    w = World(plan_builtins(), reuse_on={"A.reverse_replay", "B.forward_prime", "B.forward_replay"})
    v = decisions(run(w)[1], VerdictReached)[-1]
    assert v.hypothesis == "inconclusive"
    assert v.next_experiment.startswith("Run the B arm again on an incarnation that starts cold; B.forward_replay's did not")
    assert "first request found its host cache not empty" in v.next_experiment
    assert "a KV store kept outside the engine included" in v.next_experiment


def _counters_left_at_load(label: str) -> World:
    w = World(plan_builtins(), reuse_on={"A.reverse_replay"})
    orig = w.answer

    def answer(d):
        r = orig(d)
        if d.action == "load" and d.args.get("label") == label:
            w.counters["host_lookups"] = 7
        return r
    w.answer = answer
    return w


def test_b_counters_not_reset_at_its_load_ask_for_a_cold_start_of_b():
    v = decisions(run(_counters_left_at_load("B"))[1], VerdictReached)[-1]
    assert v.next_experiment.startswith("Run the B arm again on an incarnation that starts cold")
    assert "counters not reset (host_lookups)" in v.next_experiment


def test_an_a_arm_that_did_not_start_cold_asks_for_the_window_again_with_each_arm_cold():
    h = run(_counters_left_at_load("A"))[1]
    assert cells(h)["A.reverse_replay"].not_fresh
    v = decisions(h, VerdictReached)[-1]
    assert (v.hypothesis, v.next_experiment.split(";")[0]) == (
        "inconclusive", "Repeat the window, each arm on an incarnation that starts cold")


def test_no_b_arm_is_loaded_once_the_order_probe_ran_on_an_incarnation_that_did_not_start_cold():
    """No B result could decide then, and B would load on the same host: the primary is not kept out for it."""
    h = run(_counters_left_at_load("A"))[1]
    loads = [d.args.get("label") for d in decisions(h, ActionRequested) if d.action == "load"]
    assert "B" not in loads
    c = cells(h)
    assert c["B.forward_prime"].status == c["B.forward_replay"].status == "deferred"
    assert c["B.forward_replay"].reason.startswith("not started: earlier result: A.reverse_replay's "
                                                   "incarnation did not start cold")
    assert abort(h) is None and decisions(h, RestorationRecorded)[-1].verified


def test_a_b_arm_still_runs_after_an_a_arm_that_started_cold_whatever_its_cells_say():
    """Only the cold-start evidence keeps B out: an A arm invalid for another reason (a drain) still gets its B."""
    stuck = [False]

    def stall_after_a_prime(world: World, hist):
        if not stuck[0] and any(isinstance(d, CellRecorded) and d.phase == "A.forward_prime" for _i, ds in hist for d in ds):
            world.drain_stuck = stuck[0] = True
        return None
    h = run(World(plan_builtins()), stall_after_a_prime)[1]
    assert cells(h)["A.reverse_replay"].status == "invalid" and not cells(h)["A.reverse_replay"].not_fresh
    assert "B" in [d.args.get("label") for d in decisions(h, ActionRequested) if d.action == "load"]


def test_a_b_arm_not_measured_for_want_of_time_still_asks_only_to_run_it():
    _w, h = run(World(plan_builtins(), reuse_on={"A.reverse_replay"}, request_s=22))
    assert decisions(h, VerdictReached)[-1].next_experiment.startswith("Run the B arm: a fresh incarnation B")


def test_a_first_request_that_finds_nothing_leaves_the_cold_prime_measured_whatever_later_requests_find():
    """Only the first request is held to an empty cache: within a prime, later bodies may reuse what earlier ones stored."""
    w = World(plan_builtins(), reuse_on={"A.reverse_replay"})
    first = [True]

    def later_hits(world: World, _history):
        if world.requests_sent == 1 and first[0]:
            first[0] = False
            world.reuse_on = {"A.reverse_replay", "A.forward_prime"}
        return None
    _w, h = run(w, later_hits)
    assert cells(h)["A.forward_prime"].status == "measured"


def test_a_request_failed_inside_the_engine_whose_health_cannot_be_read_then_aborts_engine_lost_not_transport():
    # vLLM's EngineCore killed: the request answers 500, and by the time /health is asked the API server has
    # exited too (seen on a real vLLM in a clean-clone CI): the /health read's own ConnectError was judged as a
    # broken transport (`malformed_transport`) before the phase could judge the engine gone
    w = World(plan_builtins())
    w.request_error[12] = "http_500"
    w.fail["health"] = "transport"
    _w, h = run(w)
    a = abort(h)
    assert a.reason == "engine_lost", a
    assert a.detail.endswith("failed with http_500 and /health could not be read (injected transport)"), a.detail
