"""The phases a method runs, built from the window's operations: a fresh incarnation, an identity phase, a
replay (prime, drains, requests, its closing identity and cell), and the projection of what is left."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from flare_diag.events.answers import Health, Identity, Incarnation, ManagerState, MetricsSample, read
from flare_diag.events.schema import (
    NS_PER_S,
    ActionDone,
    Alarm,
    RequestDone,
    RequestMeasured,
)
from flare_diag.policies import consistency, guards, rules
from flare_diag.policies.core import WindowCore
from flare_diag.policies.drain import Drained, drain
from flare_diag.policies.driver import Act, Proc
from flare_diag.policies.interpret import PRIMES
from flare_diag.policies.plan import PhaseSpec, expected_identity
from flare_diag.policies.planner import LEARN_ROUNDS, TRACE_WARMUP, phase_requests
from flare_diag.policies.state import Running

OCCUPANCY = ("host_cache_records", "host_cache_bytes_used", "rows_used", "pages_used", "host_cache_tokens_used")


def fresh_incarnation(w: WindowCore, label: str) -> Generator[Any, Any, bool]:
    if w.state.load_unseen and not (yield from host_at_rest(w, label)):
        return False
    cand = w.candidate_recipe
    if w.state.candidate_loaded is not None:
        was = w.state.candidate_loaded
        res = yield from w.act("unload", {"recipe": cand, "sha256": w.state.candidate_sha})
        if not res.ok:
            w.incarnation_failed(label, f"unload of incarnation {was} failed: {res.detail}",
                                 unseen=unseen("unload", was, res.error))
            return False
    w.candidate_unloaded()
    started = w.now
    res = yield from w.act("load", {"recipe": cand, "sha256": w.state.candidate_sha, "label": label})
    # a load that failed after a while says the next may take as long: later arms are fitted to it
    w.est.observe_load((w.now - started) / NS_PER_S)
    if not res.ok:
        w.incarnation_failed(label, f"candidate incarnation {label} did not load: {res.detail or res.error}",
                             unseen=unseen("load", label, res.error))
        return False
    w.candidate_loaded_as(label, read(Incarnation, res).incarnation)
    return True


def unseen(op: str, label: str | None, error: str | None) -> str:
    """The words of a failed load or unload that got no answer within its deadline, or "" for one the host
    answered: it may still be running on the host, or have finished after the window stopped waiting."""
    if error != "timeout":
        return ""
    return f"the candidate's {op} as incarnation {label} got no answer within its deadline"


def host_at_rest(w: WindowCore, label: str) -> Generator[Any, Any, bool]:
    """After a load or unload that got no answer, the next goes only to a manager that shows nothing loaded
    and nothing running: a load sent over one still starting could hold two engines' memory at once.
    Anything else (a load still running, a recipe loaded, no answer) stops every later candidate load;
    the restore reads the manager's state before it changes anything."""
    st = yield from w.act("manager_state", {})
    said = read(ManagerState, st) if st.ok else None
    loaded = said.recipe_loaded() if said is not None else None
    if said is not None and loaded is None and not said.busy:
        w.host_at_rest()
        return True
    seen = (f"could not be read ({st.detail or st.error})" if said is None else
            "showed a load or unload still running" if said.busy or loaded is None else f"showed {loaded.recipe} loaded")
    why = f"{w.state.load_unseen}, and the manager then {seen}: no later arm loads the candidate"
    w.loads_stopped(why)
    w.incarnation_failed(label, f"not started: {why}")
    return False


def run_phase(w: WindowCore, ph: PhaseSpec) -> Proc:
    t = w.plan.timing
    if ph.id in w.state.cells:
        return
    if ph.incarnation in w.state.unverified_incarnations:
        w.record_cell(ph.id, "invalid", w.state.unverified_incarnations[ph.incarnation], comparable=False,
                      not_fresh=True)
        return
    for dep in ph.requires_measured:
        if w.state.status(dep) != "measured":
            w.record_cell(ph.id, "deferred", f"not started: earlier result: {dep} was not measured", comparable=ph.comparable)
            return
    end = w.now + int(w.est.phase_s(ph) * NS_PER_S)
    if end > w.stop_ns():
        w.record_cell(ph.id, "deferred", f"not started: estimated end at minute {w.minute(end):.1f} passes the stop"
                f" minute {t.stop_min:g}", comparable=ph.comparable)
        check_projection(w)
        return
    w.phase_started(ph.id, end)
    if ph.kind == "identity":
        yield from identity_phase(w, ph)
    else:
        yield from replay_phase(w, ph)


def projected_required_end_ns(w: WindowCore, current: PhaseSpec | None = None, skip: int = 0) -> int:
    """When the required cells not yet decided would end, by the estimate now."""
    est = w.est
    s = est.phase_s(current, skip) if current is not None and not current.optional else 0.0
    loaded = w.state.candidate_loaded
    for arm in w.arms:
        todo = [p for p in arm.phases if not p.optional and p.id not in w.state.cells and (current is None or p.id != current.id)]
        if todo:
            s += est.arm_s(arm, loaded, phases=todo)
            loaded = arm.incarnation
    return w.now + int(s * NS_PER_S)


def check_projection(w: WindowCore, current: PhaseSpec | None = None, skip: int = 0) -> None:
    """Raises the projected-overrun alarm when the required cells' projected end passes the stop
    minute (once each time it starts to; again only after the projection has fit once more)."""
    if w.est.rounds < LEARN_ROUNDS:
        return  # a projection from the plan's guesses alone is no news to an operator
    end = projected_required_end_ns(w, current, skip)
    late = end > w.stop_ns() and any(not p.optional and p.id not in w.state.cells for p in w.all_phases)
    if late and not w.state.overrun_projected:
        w.emit(Alarm(kind="projected_overrun",
                      detail=f"the required cells' projected end is minute {w.minute(end):.1f}, past the stop minute "
                             f"{w.plan.timing.stop_min:g} (pace x{w.est.pace:.2f} of the rate model + {w.est.overhead_s:.1f} s a request)"))
    w.overrun_projection(late)


def identity_phase(w: WindowCore, ph: PhaseSpec) -> Proc:
    ident_res = yield from w.act("read_identity", {})
    if not ident_res.ok:
        w.record_cell(ph.id, "failed", f"identity could not be read: {ident_res.detail}")
        return
    ident, said = ident_res.data, read(Identity, ident_res)  # the whole answer is what later reads are held to
    if said.incarnation is None and w.state.candidate_id is not None:  # the incarnation the window loaded is not there
        yield from _lost_if_gone(w, ph, "at the phase's start")
    mism = rules.identity_mismatches(expected_identity(w.plan), ident, trace=False)
    if w.state.candidate_sha and said.recipe_sha256 != w.state.candidate_sha:
        mism.append(f"recipe_sha256: expected {w.state.candidate_sha}, found {said.recipe_sha256}")
    if w.state.candidate_id is not None and said.incarnation != w.state.candidate_id:
        mism.append(f"incarnation: expected {w.state.candidate_id}, found {said.incarnation}")
    inc_gpus = (w.state.incumbent.identity if w.state.incumbent else {}).get("gpus")
    if inc_gpus is not None and ident.get("gpus") is not None:
        # the seed: "same two GPUs at 300 W" as the incumbent ran on
        mism += [f"against the incumbent's {m}" for m in rules.gpu_changes(inc_gpus, ident["gpus"])]
    if mism:
        loaded = {"incarnation": w.state.candidate_id}
        w.abort_inside(rules.drift_reason(loaded, ident, mism), f"{ph.id}: " + "; ".join(mism))
    w.identity_verified(ph.incarnation, ident)
    reason = "identity verified without generation"
    if ph.fresh:
        m = yield from w.act("scrape_metrics", {})
        if not m.ok:
            w.record_cell(ph.id, "failed", f"metrics could not be read: {m.detail}")
            return
        sample = read(MetricsSample, m)
        nonzero = rules.counters_reset(sample.counters)
        g = sample.gauges
        occupied = [k for k in OCCUPANCY if g.get(k)]
        startup = rules.startup_only(sample.counters, {k: g.get(k) for k in OCCUPANCY}, *w.startup) if nonzero else None
        if startup:  # the engine's own warm-up (SGLang's) is counted as any request is, and explains all there is
            nonzero = occupied = []
        observable = any(g.get(k) is not None for k in OCCUPANCY)
        if nonzero or occupied:
            why = (f"fresh incarnation {ph.incarnation} not verified: counters not reset ({', '.join(nonzero[:4]) or 'none'});"
                   f" host cache occupied ({', '.join(occupied) or 'none'})")
            w.incarnation_unverified(ph.incarnation, why)
            w.record_cell(ph.id, "invalid", why, comparable=False, not_fresh=True)
            return
        reset = "counters reset" + (f" (but for {startup})" if startup else "")
        reason += (f"; {reset} and empty host cache verified" if observable else
                   f"; {reset} verified; host cache occupancy not observable on this target")
        w.incarnation_cold(ph.incarnation)
    w.record_cell(ph.id, "measured", reason, requests=0, incarnation_id=w.state.candidate_id, identity_held=True)


def hold_identity(w: WindowCore, ph: PhaseSpec, observed: dict[str, Any], when: str) -> Proc:
    """Aborts `identity_drift` when an identity read inside a phase differs from the identity
    verified for its incarnation (contract 4, amended 2026-12-01); an identity with no incarnation
    at all is an engine that is gone, asked once through /health (`engine_lost`)."""
    verified = w.state.verified_identity.get(ph.incarnation)
    if verified is None:
        return
    changes = rules.identity_changes(verified, observed)
    if not changes:
        return
    if observed.get("incarnation") is None:
        yield from _lost_if_gone(w, ph, when)
    reason = rules.drift_reason(verified, observed, changes)
    if reason == "identity_drift":
        w.identity_drifted()
    w.abort_inside(reason, f"{ph.id}: identity {when} differs from the one verified for incarnation "
                           f"{ph.incarnation}: " + "; ".join(changes))


def _lost_if_gone(w: WindowCore, ph: PhaseSpec, when: str) -> Proc:
    """An identity with no incarnation at all: the engine is asked once through /health, and one that does not
    answer 200 is gone (`engine_lost`); one that does goes on to be judged as any other identity."""
    h = yield from w.act("health", {})
    if not (h.ok and read(Health, h).status == 200):
        w.abort_inside("engine_lost", f"{ph.id}: the identity {when} shows no incarnation loaded and /health "
                                       f"{_health_said(h)}")


def _health_said(h: ActionDone) -> str:
    """What /health said, in a report's words: 'answered 503', or 'could not be read (health: ConnectError)'."""
    return rules.health_words(read(Health, h).status if h.ok else (h.detail or h.error or "no answer"))


def _phase_caveat(w: WindowCore, ph: PhaseSpec) -> str:
    if ph.id == TRACE_WARMUP:
        return ("; warm-up of the trace fixture, not evidence: it runs before the first trace pair so that every"
                " trace arm meets the same warm host cache")
    if ph.trace is not None:
        return (f"; trace {'on' if ph.trace else 'off'} at C{ph.concurrency}, one arm of an off/on pair: its"
                f" timings are descriptive")
    if ph.kind == "consistency":
        return "; correctness evidence, not a latency arm"
    if not ph.comparable:
        full = len(w.state.fixtures.get(ph.fixture or "", {}).get("sha256", [])) or "full"
        return f"; non-fresh initial state, not comparable to the {full}-prompt arms"
    return ""


class _Tally:
    """What a replay phase's requests gave, round by round, for its cell."""

    def __init__(self) -> None:
        self.answers: list[consistency.Answer] = []  # a consistency phase's, in order: the cold pass, then the warm
        self.hit_requests: list[int] = []
        self.failures: list[str] = []
        self.disagree: list[str] = []  # requests whose counters and own cached_tokens differ (reuse_disagreement)
        self.overlong: list[str] = []  # requests answered with more tokens than their body's max_tokens
        self.reprompted: list[str] = []  # exact bodies counted at another prompt size than before (_prompt_changed)
        self.overcached: list[str] = []  # requests whose cached_tokens exceed their own prompt_tokens
        self.replayed: list[str] = []  # requests answered with an earlier answer's completion id (_answer_replayed)
        self.warm: list[str] = []  # what a cold incarnation's first request found in the host cache (_found_when_cold)
        self.ids: dict[str, tuple[str, int]] = {}  # the completion ids this phase's answers named -> (phase, #)
        self.answered = 0  # requests answered ok
        self.sent = 0  # requests sent and answered: all of the phase's, unless it stopped early
        self.generated: int | None = 0  # their completion_tokens added up (None once one did not say)
        self.natural = 0


def replay_phase(w: WindowCore, ph: PhaseSpec) -> Proc:
    plan = w.plan
    fixture = ph.fixture or ""
    reqs = phase_requests(ph, len(w.est.work.get(fixture, [])))
    prime = ph.prime or PRIMES.get(ph.id)
    if prime is not None and (why := _prime_not_measured(w, prime)) is not None:
        # a replay reads the state its own prime left: without it there is nothing to replay against
        w.record_cell(ph.id, "invalid", f"not run: its prime {prime} was not measured ({why})", comparable=ph.comparable,
                prime=prime, incarnation_id=w.state.candidate_id)
        return
    if ph.trace is not None and not (yield from _set_trace(w, ph)):
        return
    started, est_end = w.state.phase_marks.get(ph.id, (None, None))
    w.phase_running(Running(id=ph.id, total=len(reqs), comparable=ph.comparable, started_minute=started,
                            estimated_end_minute=est_end))
    drained = yield from drain(w, plan.timing.drain_timeout_s, f"before {ph.id}")
    if not drained.settled:
        w.phase_stopped()
        w.record_cell(ph.id, "invalid", f"drain before the phase did not settle within {w.drain_timeout_s(plan.timing.drain_timeout_s):g} s"
                f"{drained.unanswered_words()}",
                comparable=ph.comparable)
        return
    before = dict(w.state.last_counters or {})
    tally = _Tally()
    prev = yield from _send_rounds(w, ph, reqs, before, tally)
    if prev is not None:
        yield from _close_phase(w, ph, tally.sent, before, prev, prime, tally)


def _prime_not_measured(w: WindowCore, prime: str) -> str | None:
    """Why a phase's prime cannot be replayed against (not measured, drifted, another incarnation); None if it can."""
    pc = w.state.cells.get(prime)
    if pc is None:
        return "not run"
    if pc.status != "measured":
        return f"{pc.status}: {pc.reason}"
    if pc.identity_held is False:
        return "its identity drifted"
    if pc.incarnation_id != w.state.candidate_id:
        return f"it ran on incarnation {pc.incarnation_id}, not {w.state.candidate_id}"
    return None


def _set_trace(w: WindowCore, ph: PhaseSpec) -> Generator[Any, Any, bool]:
    """The phase's trace switch, checked to have changed nothing else; False (its cell failed) if not set."""
    res = yield from w.act("set_trace", {"enabled": ph.trace})
    if not res.ok or read(Identity, res).trace_enabled != ph.trace:
        w.record_cell(ph.id, "failed", f"trace could not be set {'on' if ph.trace else 'off'}: {res.detail}", comparable=False)
        return False
    mism = guards.trace_toggle(expected_identity(w.plan), res.data, w.state.ref_labels, bool(ph.trace))
    if mism:
        w.abort_inside("identity_drift", f"{ph.id}: the trace toggle changed more than trace_enabled: " + "; ".join(mism))
    w.trace_switched(ph.incarnation, ph.trace)
    return True


def _send_rounds(w: WindowCore, ph: PhaseSpec, reqs: list[int], before: dict[str, Any], tally: _Tally) -> Generator[Any, Any, dict[str, Any] | None]:
    """The phase's requests, `concurrency` at a time, until done or the stop minute; the last counters
    read, or None when the stop minute cut it short (its cell then said so)."""
    fixture = ph.fixture or ""
    shas = w.state.fixtures.get(fixture, {}).get("sha256", [])
    prev = before
    k = 0
    while k < len(reqs):
        batch = reqs[k:k + ph.concurrency]
        if w.now >= w.stop_ns() or w.now + int(w.est.round_s(fixture, batch) * NS_PER_S) > w.stop_ns():
            w.phase_stopped()
            w.record_cell(ph.id, "invalid", f"stopped after {k} of {len(reqs)} requests: the next request's estimated"
                    f" end passes the stop minute {w.plan.timing.stop_min:g}", requests=k, comparable=ph.comparable)
            return None
        sent = w.now
        ids = [w.request("send_request", {"phase": ph.id, "fixture": ph.fixture, "order_index": k + j, "body_index": bi,
                                           "body_sha256": shas[bi] if bi < len(shas) else ""}, True)
               for j, bi in enumerate(batch)]
        results = yield Act(tuple(ids))
        # the phase's last requests have finished: what follows (its reads, its closing drain) is
        # judged as the closing of a finished phase, even across the stop minute
        w.phase_closing(k + len(batch) >= len(reqs))
        _answered_as_verified(w, ph, results)
        delta: dict[str, Any] = {}
        if ph.concurrency == 1:
            delta, prev = yield from _between_requests(w, ph, k, prev, tally)
            if w.state.cold == ph.incarnation:
                tally.warm = _found_when_cold(delta, k)
        w.cold_ended()
        done = [rd for rd in results if isinstance(rd, RequestDone) and rd.outcome == "ok"]
        w.est.observe_round(fixture, batch, (w.now - sent) / NS_PER_S,
                            {rd.body_index: rd.completion_tokens for rd in done},
                            {rd.body_index: rd.prompt_tokens for rd in done})
        _tally_round(w, ph, k, results, delta, tally)
        yield from _engine_still_there(w, ph, results)
        k += len(batch)
        tally.sent = k
        w.requests_done(k)
        check_projection(w, ph, k)
        if tally.warm:  # nothing more on this incarnation can be measured: no more of the primary's time on it
            break
    return prev


def _answered_as_verified(w: WindowCore, ph: PhaseSpec, results: list[Any]) -> None:
    """Aborts `identity_drift` when an answer names a model that is neither the one its incarnation's identity
    was verified to serve nor the one its body asked for, where the engine's answers name the model that
    served them (`model_answered` is "" elsewhere): an answer is evidence only of the model that gave it."""
    served = (w.state.verified_identity.get(ph.incarnation) or {}).get("model")
    for rd in results:
        said = rd.model_answered if isinstance(rd, RequestDone) and rd.outcome == "ok" else ""
        if said and served is not None and said not in (served, rd.model_asked):
            w.abort_inside("identity_drift", f"{ph.id}: request #{rd.order_index} was answered as model {said!r}, "
                                             f"not {served!r}, the model incarnation {ph.incarnation}'s identity serves")


def _between_requests(w: WindowCore, ph: PhaseSpec, k: int, prev: dict[str, Any], tally: _Tally) -> Generator[Any, Any, tuple[dict[str, Any], dict[str, Any]]]:
    """Between requests at C1: the counters, and the identity (a read, no generation), so that a drift
    is caught within one request; (this request's counter delta, the counters now)."""
    delta: dict[str, Any] = {}
    m, ident = yield from w.act_all([("scrape_metrics", {}), ("read_identity", {})])
    if m.ok:
        counters = read(MetricsSample, m).counters
        delta = rules.counter_delta(prev, counters)
        prev = counters
        if delta.get("host_hits"):
            tally.hit_requests.append(k)
    if ident.ok:
        yield from hold_identity(w, ph, ident.data, f"after request #{k}")
    return delta, prev


def _tally_round(w: WindowCore, ph: PhaseSpec, k: int, results: list[Any], delta: dict[str, Any], tally: _Tally) -> None:
    """Each answer of a round: measured (RequestMeasured), failed, a natural failure, a reuse that disagrees."""
    for j, rd in enumerate(results):
        if not isinstance(rd, RequestDone):
            tally.failures.append(f"#{k + j}: {rd.error}")
            continue
        nf = None
        if rd.outcome != "ok":
            tally.failures.append(f"#{rd.order_index}: {rd.error or rd.outcome}")
        else:
            nf = rules.natural_failure(rd.finish_reason, rd.visible_output)
            tally.natural += nf is not None
            tally.disagree += reuse_disagreement(w.reuse_identity, delta, rd)
            tally.overlong += _beyond_max_tokens(w, ph, rd)
            tally.reprompted += _prompt_changed(w, ph, rd)
            tally.overcached += _cached_beyond_prompt(rd)
            tally.replayed += _answer_replayed(w, ph, rd, tally)
            tally.answered += 1
            tally.generated = None if tally.generated is None or rd.completion_tokens is None \
                else tally.generated + rd.completion_tokens
        if ph.kind == "consistency":
            tally.answers.append(consistency.Answer(rd.body_index, rd.output_sha256 if rd.outcome == "ok" else "",
                                                    rd.cached_tokens, delta.get("host_reused_tokens")))
        w.emit(RequestMeasured(phase=ph.id, order_index=rd.order_index, body_index=rd.body_index,
                                body_sha256=rd.body_sha256, outcome=rd.outcome, natural_failure=nf,
                                delta=delta if ph.concurrency == 1 else {}))


def _beyond_max_tokens(w: WindowCore, ph: PhaseSpec, rd: RequestDone) -> list[str]:
    """[a line] when the engine answered with more tokens than the body's max_tokens allows (a gateway that
    rewrote it, an engine that reads another field): it did not serve the body as sent; else []."""
    work = w.est.work.get(ph.fixture or "", [])
    limit = work[rd.body_index].max_tokens if rd.body_index < len(work) else None
    if not limit or rd.completion_tokens is None or rd.completion_tokens <= limit:
        return []
    return [f"#{rd.order_index}: {rd.completion_tokens:,} > {limit:,}"]


def _prompt_changed(w: WindowCore, ph: PhaseSpec, rd: RequestDone) -> list[str]:
    """[a line] when the engine counted another prompt size for an exact body than it counted for the same
    body before on the same incarnation (same recipe, same tokenizer, same template): it was not given the
    same prompt; else [] (the first time a body is seen, it is remembered)."""
    if rd.prompt_tokens is None or not rd.body_sha256:
        return []
    first = w.prompt_counted(ph.incarnation or "", rd.body_sha256, (rd.prompt_tokens, ph.id, rd.order_index))
    if first[0] == rd.prompt_tokens:
        return []
    return [f"#{rd.order_index}: {rd.prompt_tokens:,}, against {first[0]:,} in {first[1]} #{first[2]}"]


def _answer_replayed(w: WindowCore, ph: PhaseSpec, rd: RequestDone, tally: _Tally) -> list[str]:
    """[a line] when the answer names the completion id an earlier request's answer on the same incarnation named:
    an engine names each generation anew, so this answer was not generated for its request (a gateway that
    answers from a store of earlier answers); else [] (the phase remembers the id; its close keeps them all)."""
    if not rd.answer_id:
        return []
    first = w.state.answers_seen.get((ph.incarnation or "", rd.answer_id)) or tally.ids.get(rd.answer_id)
    if first is None:
        tally.ids[rd.answer_id] = (ph.id, rd.order_index)
        return []
    return [f"#{rd.order_index}: {first[0]} #{first[1]}'s answer {rd.answer_id[:40]!r}"]


def _found_when_cold(delta: dict[str, Any], k: int) -> list[str]:
    """[a line] when the first request on an incarnation verified fresh found something in its host cache (its C1
    counter delta); else []. Nothing on the incarnation could have stored it yet: the cache outlives the engine
    (an external KV store the engine's occupancy gauges do not see), or the counters are not this incarnation's."""
    hits, reused, found = delta.get("host_hits"), delta.get("host_reused_tokens"), delta.get("external_found_tokens")
    if not hits and not reused and not found:
        return []
    # each figure the engine exports (vLLM's host hits and reuse are not observable, not 0)
    said = [f"{int(hits):,} host hits" if hits is not None else "", f"{int(reused):,} tokens reused" if reused is not None else "",
            f"{int(found):,} tokens found in a cache outside the engine" if found else ""]
    return [f"#{k}: " + ", ".join(p for p in said if p)]


def _cached_beyond_prompt(rd: RequestDone) -> list[str]:
    """[a line] when a request's cached tokens exceed its whole prompt (a part above its whole); else []."""
    if rd.cached_tokens is None or rd.prompt_tokens is None or rd.cached_tokens <= rd.prompt_tokens:
        return []
    return [f"#{rd.order_index}: cached_tokens {rd.cached_tokens:,} > prompt_tokens {rd.prompt_tokens:,}"]


def _engine_still_there(w: WindowCore, ph: PhaseSpec, results: list[Any]) -> Proc:
    """An engine that stopped answering, or failed a request inside itself: /health asked once, and one that
    does not answer 200 aborts the window rather than send the rest of the phase into an engine that is gone
    (vLLM's API server answers 500 for a while after its EngineCore died, and its /health 503:
    vllm/entrypoints/serve/instrumentator/health.py)."""
    unavailable = [rd for rd in results if getattr(rd, "error", None) in rules.UNAVAILABLE]
    if not unavailable:
        return
    h = yield from w.act("health", {})
    if not (h.ok and read(Health, h).status == 200):
        w.abort_inside("engine_lost", f"{len(unavailable)} request(s) of {ph.id} failed with "
                                       f"{unavailable[0].error} and /health {_health_said(h)}")


def _close_phase(w: WindowCore, ph: PhaseSpec, requests: int, before: dict[str, Any], prev: dict[str, Any], prime: str | None,
                 tally: _Tally) -> Proc:
    """The phase's closing drain, then its identity (still inside its bound past the stop minute: a phase
    is held to the identity its incarnation was verified on), then its cell."""
    if tally.ids:
        w.answers_seen(ph.incarnation or "", tally.ids)
    w.phase_closing(True)
    drained = yield from drain(w, w.plan.timing.drain_timeout_s, f"after {ph.id}")
    after = w.state.last_counters if drained.settled else prev
    closing = yield from w.act("read_identity", {})
    w.phase_closing(False)
    held, changes = None, []
    if closing.ok and ph.incarnation in w.state.verified_identity:
        changes = rules.identity_changes(w.state.verified_identity[ph.incarnation], closing.data)
        held = not changes
    w.phase_stopped()
    delta = rules.counter_delta(before, after or {})
    host, gpu = rules.host_gpu(delta)
    common = dict(requests=requests, host=host, gpu=gpu, comparable=ph.comparable, counters=delta,
                  natural_failures=tally.natural, prime=prime, incarnation_id=w.state.candidate_id, identity_held=held,
                  hit_requests=tally.hit_requests, drain_unseen=sorted(w.state.drain_unseen))
    phase_cell(w, ph, common, closing, drained, changes, tally)


def reuse_disagreement(identity: list[str], delta: dict[str, Any], rd: RequestDone) -> list[str]:
    """[a line] when the C1 deltas of the engine's reuse counters do not sum to the request's own
    cached_tokens (engine_profiles.REUSE_IDENTITY); [] when they do, or when either is not known."""
    seen = [delta[n] for n in identity if delta.get(n) is not None]
    if not seen or rd.cached_tokens is None or sum(seen) == rd.cached_tokens:
        return []
    return [f"#{rd.order_index}: counters {sum(seen)}, cached_tokens {rd.cached_tokens}"]


def _not_as_sent(ph: PhaseSpec, tally: _Tally, reqs: int, delta: dict[str, Any]) -> str | None:
    """Why the phase's answers show the host did not serve its bodies as the window sent them, or None:
    then no later phase is the plan's experiment either, and the window aborts `not_as_sent`."""
    if tally.overlong:
        return (f"the engine answered {len(tally.overlong)} of {reqs} requests with more tokens than their body's "
                f"max_tokens ({', '.join(tally.overlong[:3])}): it did not serve the bodies as sent, so what it "
                f"generated and stored is not what they ask")
    if tally.reprompted:
        return (f"the engine counted another prompt size for {len(tally.reprompted)} of {reqs} exact bodies than it "
                f"counted for the same bodies earlier on incarnation {ph.incarnation} ({'; '.join(tally.reprompted[:3])}): "
                f"it was not given the prompts the window sent, so what it reused is not what these bodies ask")
    if tally.replayed:
        return (f"the host answered {len(tally.replayed)} of {reqs} requests with an answer an earlier request on "
                f"incarnation {ph.incarnation} already had, completion id and all ({', '.join(tally.replayed[:3])}): "
                f"they were not generated for these requests, so the engine's reuse was not measured by them")
    if (finished := rules.finished_short(delta, tally.answered)) is not None:
        return (f"the engine counted {finished:,} requests finished during the phase while {tally.answered:,} were "
                f"answered: {tally.answered - finished:,} answers are not in its count (answered by something before "
                f"or beside it, or its counters are another engine's or lag it), so its reuse cannot be read from "
                f"this phase")
    if (counted := rules.generated_short(delta, tally.generated)) is not None:
        return (f"the engine counted {counted:,} tokens generated during the phase while its {tally.answered:,} "
                f"answers say {tally.generated:,}: answers are not in its count (answered by something before or "
                f"beside it, or its counters are another engine's or lag it), so its reuse cannot be read from "
                f"this phase")
    return None


def _answers_contradict(ph: PhaseSpec, tally: _Tally, reqs: int, delta: dict[str, Any]) -> str | None:
    """Why the phase's answers cannot be what its bodies ask, or what its counters say (the figures every
    judgement after it reads), or None."""
    if why := _not_as_sent(ph, tally, reqs, delta):
        return why
    if tally.overcached:
        return (f"the engine's own answers contradict themselves: {len(tally.overcached)} of {reqs} requests say more "
                f"tokens were cached than their prompt has ({', '.join(tally.overcached[:3])}): its reuse figures "
                f"cannot be trusted")
    if tally.disagree:
        return (f"the engine's counters and its own per-request cached_tokens disagree on {len(tally.disagree)} of "
                f"{reqs} requests ({', '.join(tally.disagree[:3])}): its reuse figures cannot be trusted")
    if tally.warm:
        return (f"the host cache of incarnation {ph.incarnation}, verified fresh, was not empty: its first request found "
                f"what nothing on it could yet have stored ({tally.warm[0]}): a cache that outlives the engine (an "
                f"external KV store its occupancy gauges do not see) or counters that are not this incarnation's; the "
                f"phase is not the cold start the method needs, and nothing measured on this incarnation is (the phase stopped "
                f"at that request)")
    return None


def phase_cell(w: WindowCore, ph: PhaseSpec, common: dict[str, Any], closing: Any, drained: Drained, changes: list[str],
               tally: _Tally) -> None:
    """A replay phase's cell once its closing drain and identity are read: invalid (a drifted or unread
    identity, a drain that did not settle), failed (requests failed), or measured (with what it was
    measured under); a drifted identity also aborts the window."""
    plan = w.plan
    reqs, natural = common["requests"], common["natural_failures"]
    if changes:
        w.record_cell(ph.id, "invalid", "its closing identity differs from the one verified for incarnation "
                f"{ph.incarnation}: " + "; ".join(changes), **common)
        w.abort_inside("identity_drift", f"{ph.id}: identity after the closing drain: " + "; ".join(changes))
    if not closing.ok:
        w.record_cell(ph.id, "invalid", f"its closing identity could not be read ({closing.detail or closing.error}), so the "
                f"identity it was measured on is not known", **common)
    elif not drained.settled:
        w.record_cell(ph.id, "invalid", f"drain after the phase did not settle within "
                      f"{w.drain_timeout_s(plan.timing.drain_timeout_s):g} s{drained.unanswered_words()}", **common)
    elif stray := rules.traffic_from_elsewhere(common["counters"], reqs):
        w.record_cell(ph.id, "invalid", f"requests from outside the window reached the quiesced engine: it {stray}, so "
                f"the phase's counters are not its own", **common)
        w.abort_inside("containment", f"{ph.id}: requests from outside the window reached the quiesced engine around the "
                                       f"router: it {stray}")
    elif contradict := rules.counters_contradict(common["host"], common["gpu"]):
        w.record_cell(ph.id, "invalid", f"the engine's counters contradict each other ({'; '.join(contradict)}): its "
                f"reuse figures cannot be trusted", **common)
    elif why := _answers_contradict(ph, tally, reqs, common["counters"]):
        w.record_cell(ph.id, "invalid", why, not_fresh=bool(tally.warm), **common)
        if tally.warm and ph.incarnation:  # every later phase on it meets what the window did not put there
            w.incarnation_unverified(ph.incarnation, f"incarnation {ph.incarnation} not verified fresh: {ph.id}'s first "
                                                     f"request found its host cache not empty ({tally.warm[0]})")
        if changed := _not_as_sent(ph, tally, reqs, common["counters"]):  # the serving path changes the bodies: every later phase too
            w.abort_inside("not_as_sent", f"{ph.id}: {changed}")
    elif tally.failures:
        w.record_cell(ph.id, "failed", f"{len(tally.failures)} of {reqs} requests failed: {', '.join(tally.failures[:3])}",
                      **common)
    elif ph.kind == "consistency":
        half = len(tally.answers) // 2
        result = consistency.judge(tally.answers[:half], tally.answers[half:])
        status, why = consistency.finding(result)
        w.record_cell(ph.id, status, why + _phase_caveat(w, ph), consistency=result, **common)
    else:
        why = f"{reqs} requests" + (f", {natural} natural output failures recorded" if natural else "")
        if w.state.stop_marked:
            why += (f"; its closing drain settled at minute {w.minute():.2f}, after the stop minute "
                    f"{plan.timing.stop_min:g} (all its requests had finished before it)")
        raised = w.drain_timeout_s(plan.timing.drain_timeout_s)
        if raised > plan.timing.drain_timeout_s:
            why += (f"; its drains were allowed {raised:g} window s, not the plan's {plan.timing.drain_timeout_s:g} "
                    f"(the scaled clock's real-seconds floor, in scaled_bounds)")
        if w.state.drain_unseen:
            why += (f"; drains judged without {', '.join(sorted(w.state.drain_unseen))} (not exposed by this host; the plan "
                    f"accepts the weaker drain)")
        w.record_cell(ph.id, "measured", why + _phase_caveat(w, ph), **common)
