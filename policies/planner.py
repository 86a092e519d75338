"""The planner: arms, per-request estimates from the work, their revision, and the window's schedule.

Pure: the estimator learns only from what it is told (rounds observed by the policy, or a
calibration built from an earlier window's log), so a forecast before quiesce and the arm gating
inside the window use the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from typing import Any

import msgspec

from flare_diag.policies.plan import PhaseSpec, Plan, trace_arm_order

PRIOR_ROUNDS = 2.0  # the starting pace and overhead weigh as much as this many observed rounds
PRIOR_SPREAD_S = 5.0  # whose work differs from the mean by this much
LEARN_ROUNDS = 8  # rounds before a calibration tells pace from overhead


class BodyWork(msgspec.Struct, frozen=True):
    """What one request body asks of the engine, as far as can be known before sending it."""

    sha256: str
    max_tokens: int
    prompt_tokens: int | None = None  # from the fixture manifest, when its tokenizer stated them
    prompt_chars: int = 0


class Calibration(msgspec.Struct, omit_defaults=True):
    """What an earlier window (or a rehearsal's probe) measured; every field optional."""

    source: str = ""
    pace: float | None = None  # observed time of the token work over the rate model's
    overhead_s: float | None = None  # observed time a request costs besides its token work
    load_s: float | None = None
    completion_tokens: dict[str, float] = {}  # body sha256 -> completion tokens observed
    prompt_tokens: dict[str, int] = {}  # body sha256 -> prompt tokens reported by the engine
    rounds: int = 0
    time_scale: float | None = None  # a rehearsal's pace holds for rehearsals at the same scale


class Arm(msgspec.Struct, frozen=True):
    """An incarnation and the phases that only make sense together on it (e.g. B's prime and replay),
    or one trace off/on pair. An arm starts only if its required phases fit (all of them, for an
    optional arm)."""

    id: str
    incarnation: str
    phases: tuple[PhaseSpec, ...]
    trace_pair: bool = False  # pairs run in the frozen order: the first that does not fit ends the order

    @property
    def required(self) -> bool:
        return any(not p.optional for p in self.phases)

    @property
    def loads(self) -> bool:
        """An arm that verifies its incarnation's identity may load it; any other (a trace pair) runs
        only on the incarnation already loaded and verified."""
        return any(p.kind == "identity" for p in self.phases)

    @property
    def gating(self) -> tuple[PhaseSpec, ...]:
        """The phases that must fit for the arm to start."""
        return tuple(p for p in self.phases if not p.optional) if self.required else self.phases


TRACE_WARMUP = "trace.warmup"


def work_from(plan: Plan, fixtures: dict[str, Any]) -> dict[str, list[BodyWork]]:
    """Each body's work as the fixture check reports it (`daemon.fixture.Fixture.work`); what it
    leaves out falls back to the plan's sampling."""
    out: dict[str, list[BodyWork]] = {}
    for f in plan.fixtures:
        d = fixtures.get(f.name) or {}
        shas = list(d.get("sha256") or [])
        n = int(d.get("count", len(shas)))
        shas += [""] * (n - len(shas))
        mt = d.get("max_tokens") or [plan.sampling.max_tokens] * n
        pt = d.get("prompt_tokens") or [None] * n
        pc = d.get("prompt_chars") or [0] * n
        out[f.name] = [BodyWork(sha256=shas[i], max_tokens=int(mt[i] or plan.sampling.max_tokens), prompt_tokens=pt[i],
                                prompt_chars=int(pc[i])) for i in range(n)]
    return out


def arms(plan: Plan) -> list[Arm]:
    """The plan's arms in the order they run: required arms first, then optional ones, each group
    in plan order. Consecutive phases on one incarnation form one arm; each trace repetition's
    off/on pair is an arm, and the first pair starts with an untimed warm-up of the trace fixture so
    that no trace arm meets a colder cache than another."""
    out: list[Arm] = []
    group: list[PhaseSpec] = []
    for ph in plan.phases:
        if group and ph.incarnation != group[-1].incarnation:
            out.append(Arm(id=group[0].incarnation, incarnation=group[0].incarnation, phases=tuple(group)))
            group = []
        group.append(ph)
    if group:
        out.append(Arm(id=group[0].incarnation, incarnation=group[0].incarnation, phases=tuple(group)))
    if plan.trace is not None:
        t = plan.trace
        order = trace_arm_order(t)
        for k in range(0, len(order), 2):
            pair = []
            if k == 0:
                pair.append(PhaseSpec(id=TRACE_WARMUP, incarnation=t.incarnation, kind="replay", fixture=t.fixture,
                                      concurrency=1, optional=True, comparable=False, trace=False))
            for pid, c, _r, on in order[k:k + 2]:
                pair.append(PhaseSpec(id=pid, incarnation=t.incarnation, kind="replay", fixture=t.fixture,
                                      concurrency=c, optional=t.optional, comparable=False, trace=on))
            out.append(Arm(id=order[k][0].rsplit(".", 1)[0], incarnation=t.incarnation, phases=tuple(pair),
                           trace_pair=True))
    return [a for a in out if a.required] + [a for a in out if not a.required]


def trace_order_stopped(arm: Arm) -> str:
    return f"not started: the frozen trace order ended at {arm.id}, the first pair that did not fit"


def phase_requests(ph: PhaseSpec, count: int) -> list[int]:
    """The body indexes a phase sends, in order."""
    idx = list(range(count))
    if ph.select_last:
        idx = idx[-ph.select_last:]
    if ph.order == "reverse":
        idx.reverse()
    if ph.kind == "consistency":
        # every body cold, then every body again with the host's reuse, newest first: a forward rescan
        # of a working set larger than the cache would find each body evicted and test nothing
        return idx + idx[::-1]
    return idx * ph.passes


class Learned(msgspec.Struct, frozen=True):
    """What the schedule's estimate knows, as a value: the calibration it started from, then each load and
    round the window timed. Its methods give the value after one more lesson; the same value where nothing
    changed (the estimator keeps each body's work until its tokens change)."""

    load_s: float = 0.0  # what a load is expected to take: the slowest so far
    completion: dict[str, float] = {}  # body sha256 -> completion tokens it used
    prompt: dict[str, int] = {}  # body sha256 -> prompt tokens the engine counted
    share_of: dict[str, float] = {}  # body sha256 -> its first observed share of max_tokens
    share_sum: float = 0.0
    sums: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # sum x, x^2, y, xy over rounds (x: work, y: time)
    rounds: int = 0

    def with_load(self, seconds: float) -> Learned:
        return self if seconds <= self.load_s else msgspec.structs.replace(self, load_s=seconds)

    def with_tokens(self, completions: Sequence[tuple[BodyWork, int]], prompts: Sequence[tuple[str, int]]) -> Learned:
        """The tokens a round's bodies really used: each body's completion and prompt, and the first share of
        its max_tokens a body used (what a body not seen yet is expected to use moves with it)."""
        completion, share_of, share_sum, prompt = self.completion, self.share_of, self.share_sum, self.prompt
        for bw, n in completions:
            if completion.get(bw.sha256) != float(n):
                completion = {**completion, bw.sha256: float(n)}
            if bw.max_tokens and bw.sha256 not in share_of:
                share_of = {**share_of, bw.sha256: min(n / bw.max_tokens, 1.0)}
                share_sum += share_of[bw.sha256]
        for sha, n in prompts:
            if prompt.get(sha) != int(n):
                prompt = {**prompt, sha: int(n)}
        if completion is self.completion and share_of is self.share_of and prompt is self.prompt:
            return self
        return msgspec.structs.replace(self, completion=completion, share_of=share_of, share_sum=share_sum, prompt=prompt)

    def with_round(self, work_s: float, actual_s: float) -> Learned:
        """One round's time against its work: one more point for the fit."""
        sx, sxx, sy, sxy = self.sums
        return msgspec.structs.replace(self, sums=(sx + work_s, sxx + work_s * work_s, sy + actual_s, sxy + work_s * actual_s),
                                       rounds=self.rounds + 1)


class Estimator:
    """Per-request estimates from each body's prompt tokens and max_tokens under the plan's rate
    model (or a calibration), revised after every round the window observes.

    A round's time is fitted as `pace * work + overhead`, where `work` is the rate model's time for
    the tokens each body really used: pace absorbs a host slower or faster per token than the plan
    says, overhead what a request costs besides its tokens (connection, scheduling, the counter
    scrape, and in a rehearsal the harness's real latency times the scale). A ridge fit that starts
    from the plan's (or the calibration's) values keeps a few rounds of one size from extrapolating
    wildly to rounds of another.

    What it has learned is a `Learned` value: its own (`observe_*` replace it), or, inside a window, the
    window state's, read through `learned` and replaced through `teach` (a fact the state records)."""

    def __init__(self, plan: Plan, work: dict[str, list[BodyWork]], cal: Calibration | None = None,
                 learned: Callable[[], Learned] | None = None, teach: Callable[[Learned], None] | None = None) -> None:
        self.plan = plan
        self.rates = plan.rates
        self.work = work
        self.cal = cal or Calibration()
        self.start = Learned(load_s=self.cal.load_s if self.cal.load_s is not None else self.rates.load_s,
                             completion=dict(self.cal.completion_tokens), prompt=dict(self.cal.prompt_tokens))
        self._own = self.start
        self._learned = learned or (lambda: self._own)
        self._teach = teach or self._keep
        self.prior_pace = self.cal.pace if self.cal.pace is not None else 1.0
        self.prior_overhead = self.cal.overhead_s if self.cal.overhead_s is not None else self.rates.request_overhead_s
        self._fit: tuple[tuple[float, ...], tuple[float, float]] | None = None  # (the sums it fits, the fit)
        # phase estimates until the next observed round: the window re-projects its remaining phases
        # after every input, and they change only when a round teaches the estimator something
        self._phase_memo: dict[tuple[Any, ...], float] = {}
        self._memo_of: Learned | None = None
        # each fixture's bodies' work_s, until a round changes a body's tokens or the output share: a
        # round changes the fit every time but the work rarely after the first pass, and re-deriving
        # every remaining request's work after each request was most of the policy's time
        self._body_work: dict[str, list[float]] = {}
        self._works_of: tuple[object, ...] = ()
        self._requests: dict[tuple[Any, ...], list[int]] = {}  # a phase's body indexes (they never change)

    def _keep(self, learned: Learned) -> None:
        self._own = learned

    @property
    def known(self) -> Learned:
        return self._learned()

    @property
    def load_s(self) -> float:
        return self.known.load_s

    @property
    def completion(self) -> dict[str, float]:
        return self.known.completion

    @property
    def prompt(self) -> dict[str, int]:
        return self.known.prompt

    @property
    def rounds(self) -> int:
        return self.known.rounds

    # --- the fit -----------------------------------------------------------------------------

    def _solve(self) -> tuple[float, float]:
        known = self.known
        if not known.rounds:  # the starting values themselves, not the fit's arithmetic on them
            return self.prior_pace, self.prior_overhead
        if self._fit is None or self._fit[0] is not known.sums:
            sx, sxx, sy, sxy = known.sums
            n = known.rounds
            a0, b0 = self.prior_pace, self.prior_overhead
            alpha, beta = PRIOR_ROUNDS * PRIOR_SPREAD_S ** 2, PRIOR_ROUNDS
            m11, m12, m22 = sxx + alpha, sx, n + beta
            r1, r2 = sxy + alpha * a0, sy + beta * b0
            det = m11 * m22 - m12 * m12
            a = (r1 * m22 - m12 * r2) / det
            b = (m11 * r2 - m12 * r1) / det
            if b < 0:  # a request costs no less than its work: refit with no overhead
                a, b = (sxy + alpha * a0) / (sxx + alpha), 0.0
            self._fit = (known.sums, (max(a, 0.05), b))
        return self._fit[1]

    @property
    def output_share(self) -> float:
        """The share of max_tokens a body not seen yet is expected to use: the plan's, moved
        towards what the bodies seen so far used."""
        return self._share_under(self.known)

    def _share_under(self, known: Learned) -> float:
        return (PRIOR_ROUNDS * self.rates.output_share + known.share_sum) / (PRIOR_ROUNDS + len(known.share_of))

    @property
    def pace(self) -> float:
        return self._solve()[0]

    @property
    def overhead_s(self) -> float:
        return self._solve()[1]

    # --- estimates ---------------------------------------------------------------------------

    def work_s(self, b: BodyWork, completion: float | None = None) -> float:
        """The rate model's time for one request's tokens."""
        return self._work_under(self.known, b, completion)

    def _work_under(self, known: Learned, b: BodyWork, completion: float | None = None) -> float:
        if completion is not None:
            out = completion
        elif b.sha256 in known.completion:
            out = known.completion[b.sha256]
        else:
            out = b.max_tokens * self._share_under(known)
        return self._prefill_under(known, b) + min(out, b.max_tokens) / self.rates.decode_tokens_per_s

    def _prefill_under(self, known: Learned, b: BodyWork) -> float:
        """The rate model's time for one request's prompt."""
        if b.sha256 in known.prompt:
            prompt: float = known.prompt[b.sha256]
        elif b.prompt_tokens is not None:
            prompt = b.prompt_tokens
        else:
            prompt = b.prompt_chars / self.rates.chars_per_token
        return prompt / self.rates.prefill_tokens_per_s

    def slowest_first_token(self, phases: Sequence[PhaseSpec]) -> tuple[float, str]:
        """The longest a stream of these phases is expected to stay silent before its first token, in window
        seconds, and whose: every prompt of the round before it prefilled first (`concurrency` of them), at the
        estimate's pace, plus its overhead. (0.0, "") when no phase sends a body."""
        a, b = self._solve()
        found = [(a * ph.concurrency * self._prefill_under(self.known, body) + b, f"{ph.fixture} #{i} at C{ph.concurrency}")
                 for ph in phases if ph.kind != "identity" for i, body in enumerate(self.work.get(ph.fixture or "", ()))]
        return max(found, default=(0.0, ""))

    def _works(self, fixture: str) -> list[float]:
        """work_s of each of the fixture's bodies (the same numbers, computed once until they change)."""
        known, held = self.known, self._works_of
        if not held or held[0] is not known.completion or held[1] is not known.prompt or held[2] is not known.share_of:
            # a body's tokens or the output share changed (a Learned's maps are replaced, never changed)
            self._body_work.clear()
            self._works_of = (known.completion, known.prompt, known.share_of)
        w = self._body_work.get(fixture)
        if w is None:
            w = self._body_work[fixture] = [self.work_s(b) for b in self.work.get(fixture, ())]
        return w

    def request_s(self, fixture: str, body: int) -> float:
        a, b = self._solve()
        return a * self._works(fixture)[body] + b

    def round_s(self, fixture: str, batch: list[int]) -> float:
        """A round of concurrent requests ends with its slowest one."""
        a, b = self._solve()
        w = self._works(fixture)
        return max((a * w[i] + b for i in batch), default=0.0)

    def drain_s(self) -> float:
        """A drain that settles at once: its polls, each a counter scrape."""
        t = self.plan.timing
        return t.stable_observations * (t.drain_poll_s + self.overhead_s)

    def phase_s(self, ph: PhaseSpec, skip: int = 0) -> float:
        """Window seconds a phase takes from its `skip`-th request on: rounds, and its drains."""
        if ph.kind == "identity" or ph.fixture is None:
            return self.drain_s()
        if self._memo_of is not self.known:
            self._phase_memo.clear()
            self._memo_of = self.known
        key = (ph.id, ph.fixture, ph.order, ph.select_last, ph.passes, ph.concurrency, skip)
        memo = self._phase_memo.get(key)
        if memo is not None:
            return memo
        which = (ph.kind, *key[:-1])
        every = self._requests.get(which)
        if every is None:
            every = self._requests[which] = phase_requests(ph, len(self.work.get(ph.fixture, [])))
        reqs = every[skip:]
        c = max(ph.concurrency, 1)
        rounds: float
        if not reqs:
            rounds = 0
        elif c == 1:  # a round per request: the same sum, in the same order, as round_s would give
            a, b = self._solve()
            w = self._works(ph.fixture)
            rounds = sum([a * w[i] + b for i in reqs])
        else:
            rounds = sum(self.round_s(ph.fixture, reqs[k:k + c]) for k in range(0, len(reqs), c))
        est = self._phase_memo[key] = rounds + (2 * self.drain_s() if skip == 0 else self.drain_s())
        return est

    def arm_s(self, arm: Arm, loaded: str | None, done: Set[str] = frozenset(),
              phases: Sequence[PhaseSpec] | None = None) -> float:
        """Window seconds to run an arm's given phases (default: the gating ones), with its load."""
        todo = [p for p in (phases if phases is not None else arm.gating) if p.id not in done]
        load = self.load_s if arm.incarnation != loaded else 0.0
        return load + sum(self.phase_s(p) for p in todo)

    # --- learning ----------------------------------------------------------------------------

    def observe_load(self, seconds: float) -> None:
        """A load this window timed: the next is expected to take as long as the slowest so far."""
        known = self.known
        if (after := known.with_load(seconds)) is not known:
            self._teach(after)

    def observe_round(self, fixture: str, batch: list[int], actual_s: float,
                      completions: dict[int, int | None], prompts: dict[int, int | None]) -> None:
        """Learns from one finished round: the tokens each body really used, then the fit."""
        bodies = self.work[fixture]
        known = self.known.with_tokens([(bodies[b], n) for b, n in completions.items() if n is not None],
                                       [(bodies[b].sha256, n) for b, n in prompts.items() if n is not None])
        if actual_s >= 0 and batch:
            # the round's work with the tokens it really used: the slowest request's
            x = max((self._work_under(known, bodies[b]) for b in batch), default=0.0)
            known = known.with_round(x, actual_s)
        if known is not self.known:
            self._teach(known)

    def learned(self, source: str, time_scale: float | None = None) -> Calibration:
        """What the observed rounds say, for a later window to start from. Pace and overhead are told
        apart only when the rounds differ enough in size (LEARN_ROUNDS of them, spread in work);
        otherwise the extra time is taken as overhead at the starting pace, which extrapolates to
        longer requests without multiplying the error."""
        a, b = self.prior_pace, self.prior_overhead
        sx, sxx, sy, sxy = self.known.sums
        n = self.known.rounds
        if n:
            var = sxx / n - (sx / n) ** 2
            if n >= LEARN_ROUNDS and var > (0.25 * sx / n) ** 2:
                a = (sxy / n - (sx / n) * (sy / n)) / var
                b = sy / n - a * sx / n
            if n < LEARN_ROUNDS or var <= (0.25 * sx / n) ** 2 or a <= 0 or b < 0:
                a = self.prior_pace
                b = max(0.0, (sy - a * sx) / n)
        return Calibration(source=source, pace=round(a, 4), overhead_s=round(b, 4), rounds=n,
                           completion_tokens=dict(self.completion), prompt_tokens=dict(self.prompt),
                           time_scale=time_scale)


class Slot(msgspec.Struct):
    phase: str
    arm: str
    required: bool
    start_min: float | None
    end_min: float | None
    status: str  # scheduled | deferred
    reason: str = ""


class Schedule(msgspec.Struct):
    """The schedule a window would follow from its t0, by the estimate."""

    plan: str
    stop_min: float
    margin_min: float
    slots: list[Slot]
    required_end_min: float | None
    fits: bool
    pace: float
    overhead_s: float
    calibration: str
    unfit: list[str] = []
    first_token_s: float = 0.0  # the slowest first token the estimate expects (Estimator.slowest_first_token)
    first_token_of: str = ""  # whose: "c1-52 #17 at C4"
    stall_s: float = 0.0  # the plan's timing.stall_s, which a stream silent before its first token would meet

    def stall_error(self) -> str | None:
        """Why the plan's stall bound would cut a stream the estimate expects to be silent longer, or None."""
        if self.first_token_s <= self.stall_s:
            return None
        return (f"timing.stall_s = {self.stall_s:g} s: expected more than the slowest first token the forecast expects, "
                f"{self.first_token_s:.1f} s ({self.first_token_of}, pace x{self.pace:.2f} + {self.overhead_s:.1f} s), or a "
                f"healthy engine would be taken for a stalled one; raise timing.stall_s")

    def render(self) -> list[str]:
        lines = [f"plan {self.plan}: stop minute {self.stop_min:g}, arm margin {self.margin_min:g} min, "
                 f"pace x{self.pace:.2f} + {self.overhead_s:.2f} s a request ({self.calibration or 'plan rates'})"]
        for s in self.slots:
            when = (f"{s.start_min:6.1f} -> {s.end_min:6.1f}" if s.start_min is not None else f"{'-':>6}    {'-':>6}")
            lines.append(f"  {when}  {s.phase:<20} {'required' if s.required else 'optional':<8} {s.status}"
                         + (f": {s.reason}" if s.reason else ""))
        if self.fits:
            lines.append(f"every required cell fits: the last ends at minute {self.required_end_min:.1f}")
        else:
            lines.append(f"required cells do not fit before the stop minute: {', '.join(self.unfit)}")
        if self.first_token_of:
            lines.append(self.stall_error() or f"the slowest first token expected, {self.first_token_s:.1f} s "
                                               f"({self.first_token_of}), is within timing.stall_s = {self.stall_s:g} s")
        return lines


def forecast(plan: Plan, est: Estimator, start_min: float = 0.0, quiesce: bool = True) -> Schedule:
    """The schedule from t0 (quiesce), by the same arm rule the window applies."""
    t = plan.timing
    now = start_min * 60 + (est.drain_s() if quiesce else 0.0)  # the quiesce drain
    stop = t.stop_min * 60
    limit = stop - t.arm_margin_min * 60
    loaded: str | None = None
    slots: list[Slot] = []
    trace_stop: str | None = None
    for arm in arms(plan):
        if arm.trace_pair and trace_stop:
            slots += [Slot(p.id, arm.id, False, None, None, "deferred", trace_stop) for p in arm.phases]
            continue
        if not arm.loads and arm.incarnation != loaded:
            why = f"incarnation {arm.incarnation} is not loaded (its own arm did not run)"
            slots += [Slot(p.id, arm.id, not p.optional, None, None, "deferred", why) for p in arm.phases]
            continue
        need = est.arm_s(arm, loaded)
        if now + need > limit:
            why = f"arm {arm.id} would end at minute {(now + need) / 60:.1f}, past {limit / 60:g}"
            slots += [Slot(p.id, arm.id, not p.optional, None, None, "deferred", why) for p in arm.phases]
            if arm.trace_pair:
                trace_stop = trace_order_stopped(arm)
            continue
        if arm.incarnation != loaded:
            now += est.load_s
            loaded = arm.incarnation
        for p in arm.phases:
            d = est.phase_s(p)
            if p.optional and now + d > stop:
                slots.append(Slot(p.id, arm.id, False, None, None, "deferred",
                                  f"would end at minute {(now + d) / 60:.1f}, past the stop minute"))
                continue
            slots.append(Slot(p.id, arm.id, not p.optional, round(now / 60, 2), round((now + d) / 60, 2), "scheduled"))
            now += d
    req = [s for s in slots if s.required]
    unfit = [s.phase for s in req if s.status != "scheduled"]
    ends = [s.end_min for s in req if s.end_min is not None]
    first_token_s, first_token_of = est.slowest_first_token(all_phases(plan))
    return Schedule(plan=plan.name, stop_min=t.stop_min, margin_min=t.arm_margin_min, slots=slots,
                    required_end_min=max(ends) if ends else None, fits=not unfit, pace=round(est.pace, 3), overhead_s=round(est.overhead_s, 3),
                    calibration=est.cal.source, unfit=unfit, first_token_s=round(first_token_s, 3),
                    first_token_of=first_token_of, stall_s=t.stall_s)


def all_phases(plan: Plan) -> list[PhaseSpec]:
    """Every phase the window may run, in the order it would run them."""
    return [p for a in arms(plan) for p in a.phases]
