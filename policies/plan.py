"""The plan schema (TOML decoded with msgspec), its semantic checks, and phase expansion."""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from flare_diag.events.answers import BuildIdentity
from flare_diag.policies.acceptance import MAX_REGRESSION, MIN_BENEFIT, percent
from flare_diag.policies.ranges import out_of_range
from flare_diag.policies.steady import Guard, GuardError, check_guards


class PlanError(ValueError):
    """A plan that cannot run; the message names the first bad field."""


class ExpectedIdentity(BuildIdentity, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What the serving identity must be: the identity's build fields (events/answers.py) and the GPUs'
    count and power limit. A field left out is not checked: only a non-production plan may leave
    fields out (a peer engine has no Flare commit or tensor parallelism to report)."""

    gpu_count: int | None = None
    gpu_power_limit_w: int | None = None


class Sampling(msgspec.Struct, forbid_unknown_fields=True):
    max_tokens: int
    temperature: float
    top_p: float
    reasoning_effort: str = "max"
    stream: bool = True  # the window measures TTFT and usage from the stream


class Timing(msgspec.Struct, forbid_unknown_fields=True):
    window_min: float = 90
    stop_min: float = 70
    restore_reserve_min: float = 20
    drain_timeout_s: float = 10
    stable_observations: int = 2
    drain_poll_s: float = 0.5
    quiesce_drain_timeout_s: float = 120
    watch_lost_s: float = 30  # a GPU or router watch silent this long aborts the window (watch_lost)
    # every action's deadline (window seconds); past it the action fails as `timeout`
    action_timeout_s: float = 60  # reads, scrapes, previews, quiesce, readmit, trace toggles
    load_timeout_s: float = 600  # loading or unloading an incarnation
    request_timeout_s: float = 600  # one replayed request or preflight generation
    # a generation's stream that gives no event this long fails as `stalled` (the engine holds it and gives
    # nothing: a hung collective, a stopped process); with /health then 200 the window aborts `engine_stalled`
    stall_s: float = 120
    arm_margin_min: float = 1.0  # an arm starts only if its required phases end this long before the stop minute
    # what the restore may take from its start: every restore action's deadline is cut to what is left
    # of it (default: the reserve less the bound on a closing drain after the stop minute)
    restore_budget_min: float | None = None

    def restore_budget(self) -> float:
        """Minutes the restore may take (`restore_budget_min`, or its default)."""
        if self.restore_budget_min is not None:
            return self.restore_budget_min
        return self.restore_reserve_min - self.closing_drain_bound_min()

    def closing_drain_bound_min(self) -> float:
        """How late after the stop minute a restore may start: a phase's closing drain runs on past
        it for at most the drain timeout."""
        return self.drain_timeout_s / 60


class Rates(msgspec.Struct, forbid_unknown_fields=True):
    """The rate model a window is planned with; `--calibrate LOG` replaces it with what a window measured."""

    prefill_tokens_per_s: float = 5000.0
    decode_tokens_per_s: float = 100.0
    output_share: float = 1.0  # expected completion tokens over max_tokens (1: every request runs to max_tokens)
    request_overhead_s: float = 0.3  # per request: connection, scheduling, the counter scrape after it
    load_s: float = 90.0  # loading one incarnation
    chars_per_token: float = 4.0  # prompt tokens from message characters, where a fixture does not state them
    # the most bodies a forecast may send to the incumbent to measure pace, where the site opts in
    # (site profile [forecast]); each is logged. 0: never
    probe_requests: int = 4

    def restore_expected_s(self) -> float:
        """What a restore is expected to take: unload and load an incarnation, and its checks."""
        return 2 * self.load_s + 8 * self.request_overhead_s


class Growth(msgspec.Struct, forbid_unknown_fields=True):
    """Bounds whose crossing is uncontrolled growth."""

    max_resident_bytes: int = 256 * 2**30
    max_host_cache_records: int = 1_000_000
    max_gpu_memory_fraction: float = 0.99
    # relative to the incarnation's own first observation, and to the window's own requests
    max_resident_growth_bytes: int = 16 * 2**30
    max_queue_excess: int = 8  # scheduler gauges (active + pending + retiring) above the requests in flight
    queue_excess_observations: int = 3  # consecutive scrapes over that excess


DRAIN_GAUGES = ("requests_active", "requests_pending", "requests_retiring",
                "host_transfers_inflight", "host_transfers_waiting")


class AbortRules(msgspec.Struct, forbid_unknown_fields=True):
    """Abort rules a plan tunes (the others are fixed by the seed's execution contract)."""

    # that many consecutive requests refused with a 4xx other than 401/403/429 abort `rejected`: a host
    # that refuses the plan's bodies wholesale (a schema, an enum value) has nothing to measure
    rejected_streak: int = 3


class Preserve(msgspec.Struct, forbid_unknown_fields=True):
    """History a window must leave untouched (the seed: "preserve wave-v1 and its hosted snapshot"): files
    or folders, relative to the plan's folder; hashed before anything changes, checked after publishing."""

    paths: list[str] = []


class Drain(msgspec.Struct, forbid_unknown_fields=True):
    """The seed's drain rule holds only where every drain gauge is exposed. A plan may accept,
    by name, gauges the site does not expose: the drain is then judged without them, a weaker
    condition every cell names."""

    accept_unobserved: list[str] = []


class StartingObservation(msgspec.Struct, forbid_unknown_fields=True):
    """What the window sets out to reproduce (the seed's 52-prompt observation), compared with
    the phase it names after that phase's closing drain. A field left out is not compared."""

    phase: str = "A.forward_prime"
    stores_per_request: float | None = None
    records: int | None = None
    bytes_used: int | None = None
    bytes_capacity: int | None = None
    restored_tokens: int | None = None
    tolerance: float = 0.02  # relative difference still called the same (bytes, stores per request)


class FixtureRef(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    # where this fixture's bodies ask another max_tokens than [sampling] (the seed's 1024-token trace
    # fixture): every other sampling field is the plan's
    max_tokens: int | None = None
    # where this fixture's bodies are greedy (an output-consistency phase's: temperature 0), or ask
    # another temperature than [sampling] for another reason
    temperature: float | None = None
    # where this fixture's bodies ask another reasoning effort (the trace fixture's answers end on their
    # own, with visible output, inside its max_tokens at "low")
    reasoning_effort: str | None = None


# consistency: each body sent twice on a fresh incarnation, cold and then with the host's reuse, and
# the answers compared (greedy bodies: cached state must not change an answer; MLPerf's TEST01/04)
PhaseKind = Literal["identity", "replay", "consistency"]


class PhaseSpec(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    incarnation: str
    kind: PhaseKind
    fixture: str | None = None
    order: Literal["forward", "reverse"] = "forward"
    select_last: int | None = None
    passes: int = 1
    concurrency: int = 1
    optional: bool = False
    comparable: bool = True
    fresh: bool = False  # first phase of a new incarnation: verify counter reset and empty host cache
    trace: bool | None = None
    requires_measured: list[str] = []
    # the phase whose state this replay reads (contract 4, amended 2026-12-01): the replay runs only
    # when its prime is measured on the same incarnation, and is `invalid` otherwise
    prime: str | None = None


class TraceArms(msgspec.Struct, forbid_unknown_fields=True):
    fixture: str
    incarnation: str = "B"
    repetitions: int = 3
    concurrency: list[int] = msgspec.field(default_factory=lambda: [1, 4])
    optional: bool = True
    # "trace overhead understood" (the seed's admission for a capture stage), per concurrency: the
    # median on-minus-off TTFT over the pairs at most this share of the off arms' median, with a 95 %
    # bootstrap interval at most this wide (in the same share)
    overhead_max: float = 0.05
    overhead_interval_max: float = 0.10


class ConditionalStage(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    admission: str


class FollowOn(msgspec.Struct, forbid_unknown_fields=True):
    """What a follow-on plan was derived from and what gates it passed (`flare-diag plan follow-on`)."""

    stage: Literal["policy", "nsight"]
    source_window: str
    source_plan_sha256: str
    verdict: str
    policy: str = ""  # stage policy: the candidate eviction policy
    baseline_policy: str = ""
    reproducer: str = ""  # the reproducer's agreement with the source window
    model_reused_tokens: dict[str, int] = {}  # policy -> host tokens the model reuses on the source's requests
    trace_overhead: str = ""  # stage nsight: the source window's overhead finding
    order: list[Literal["baseline", "candidate"]] = []  # the windows to run, in order
    repeats: int = 3
    min_benefit: float = MIN_BENEFIT  # the acceptance rule's bar: the seed's, or a stricter one
    max_regression: float = MAX_REGRESSION
    forced: bool = False
    override: str = ""  # the gates --force passed over, as they were said
    # the greedy fixture of the plan's output-consistency phase (independent correctness)
    consistency_fixture: str = ""
    # the recorded review that let this follow-on be written (by whom, and where: log and seq)
    review: str = ""


class VerdictSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Which cache the order probe of contract section 4 reads: the host tier (the seed's), or the GPU
    prefix cache on an engine that has no host tier (policies/interpret.py, `_prefix_rule`)."""

    tier: Literal["host", "gpu_prefix"] = "host"


class Plan(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    identity: ExpectedIdentity
    sampling: Sampling
    fixtures: list[FixtureRef]
    phases: list[PhaseSpec]
    timing: Timing = msgspec.field(default_factory=Timing)
    rates: Rates = msgspec.field(default_factory=Rates)
    growth: Growth = msgspec.field(default_factory=Growth)
    trace: TraceArms | None = None
    conditional: list[ConditionalStage] = []
    drain: Drain = msgspec.field(default_factory=Drain)
    abort: AbortRules = msgspec.field(default_factory=AbortRules)
    starting_observation: StartingObservation | None = None
    production: bool = True
    # who wrote the plan: a production plan runs only after someone else reviewed its exact bytes
    author: str = ""
    preserve: Preserve = msgspec.field(default_factory=Preserve)
    description: str = ""
    follow_on: FollowOn | None = None
    # the routed pool's steady state, watched on the site's Prometheus (policies/steady.py)
    guards: list[Guard] = []
    verdict: VerdictSpec = msgspec.field(default_factory=VerdictSpec)
    # what runs between the take-down and the restore (policies/methods): the seed's unless named
    method: str = "cache_diagnostics"


FORBIDDEN_KINDS = {
    "isolated_rank_kernel_replay": "no unsafe isolated replay of cooperative rank kernels",
    "kernel_replay": "kernel replay is a later conditional stage, admitted only after cache effects and capture overhead are understood",
    "nsight_capture": "Nsight capture is a later conditional stage, admitted only after cache effects and capture overhead are understood",
}


MAX_PLAN_BYTES = 1 << 20


def decode_plan(data: bytes, source: str = "plan") -> Plan:
    """Decodes and checks a TOML plan; PlanError names the first bad field."""
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(f"{source}: {len(data)} bytes; a plan is at most {MAX_PLAN_BYTES} bytes")
    try:
        raw = msgspec.toml.decode(data)
    except msgspec.DecodeError as exc:
        raise PlanError(f"{source}: not valid TOML ({exc})") from None
    except RecursionError:  # arrays or tables nested thousands deep: nothing a plan needs
        raise PlanError(f"{source}: nested too deeply to be a plan") from None
    for i, ph in enumerate(raw.get("phases", []) if isinstance(raw, dict) else []):
        kind = ph.get("kind") if isinstance(ph, dict) else None
        if isinstance(kind, str) and kind in FORBIDDEN_KINDS:
            raise PlanError(f"{source}: phases[{i}].kind = {kind!r} is never schedulable: {FORBIDDEN_KINDS[kind]}")
    plan = plan_from_builtins(raw, source)
    # a plan file's admission, not its replay: a log recorded before plans named their authors still replays
    if plan.production and not plan.author.strip():
        raise PlanError(f"{source}: author: a production plan must name its author (someone else reviews it "
                        f"before it runs: `flare-diag review sign`)")
    return plan


def plan_from_builtins(raw: object, source: str = "plan") -> Plan:
    try:
        plan = msgspec.convert(raw, Plan)
    except msgspec.ValidationError as exc:
        raise PlanError(f"{source}: {exc}") from None
    except RecursionError:
        raise PlanError(f"{source}: nested too deeply to be a plan") from None
    _check_ranges(msgspec.to_builtins(plan), source)
    check_plan(plan, source)
    return plan


def _check_ranges(builtins: dict[str, Any], source: str) -> None:
    """Every number in its range (policies/ranges.RANGES), and finite: `inf` or `nan` would pass a
    comparison and crash (or never end) the window that meets it."""
    bad = out_of_range(builtins)
    if bad is None:
        return
    where, value, rng = bad
    if rng is None:
        raise PlanError(f"{source}: {where} = {value}: expected a finite number")
    raise PlanError(f"{source}: {where} = {value:g}: expected {rng.words()} ({rng.why})")


def _within(source: str, field: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise PlanError(f"{source}: {field} = {value}: expected between {low:g} and {high:g}")


_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def check_plan(plan: Plan, source: str = "plan") -> None:
    """Every rule that relates a plan's keys to one another (each key's own range is policies/ranges),
    in a fixed order: the first bad field is named."""
    _check_method(plan, source)
    _check_identity(plan, source)
    _check_timing(plan, source)
    _check_names(plan, source)
    seen = _check_phases(plan, source)
    _check_observation_trace_and_guards(plan, source, seen)


# the methods a plan may name: policies.methods.register adds each (the methods import plans, not the reverse)
METHOD_NAMES: set[str] = {"cache_diagnostics"}


def _check_method(plan: Plan, source: str) -> None:
    if plan.method not in METHOD_NAMES:
        raise PlanError(f"{source}: method = {plan.method!r}: expected one of {', '.join(sorted(METHOD_NAMES))}")


def _check_identity(plan: Plan, source: str) -> None:
    if plan.production:
        missing = [f for f in ExpectedIdentity.__struct_fields__ if getattr(plan.identity, f) is None]
        if missing:
            raise PlanError(f"{source}: identity.{missing[0]}: a production plan must state every identity field")
    for i, p in enumerate(plan.preserve.paths):
        if not p.strip() or "\0" in p:
            raise PlanError(f"{source}: preserve.paths[{i}] = {p!r}: expected a file or folder path")


def _check_timing(plan: Plan, source: str) -> None:
    t = plan.timing
    # each key's own range is policies/ranges.RANGES (checked by plan_from_builtins); what follows
    # relates keys to one another
    _within(source, "fixtures (count)", len(plan.fixtures), 1, 64)
    _within(source, "phases (count)", len(plan.phases), 1, 1000)
    if plan.trace is not None:
        _within(source, "trace.concurrency (count)", len(plan.trace.concurrency), 1, 16)
    if not 0 < t.stop_min < t.window_min:
        raise PlanError(f"{source}: timing.stop_min = {t.stop_min} must be above 0 and below timing.window_min = {t.window_min}")
    if t.window_min - t.stop_min < t.restore_reserve_min:
        raise PlanError(f"{source}: timing.restore_reserve_min = {t.restore_reserve_min} does not fit between stop_min and window_min")
    fo = plan.follow_on
    if fo is not None and not (MIN_BENEFIT <= fo.min_benefit <= 1 and 0 <= fo.max_regression <= MAX_REGRESSION):
        raise PlanError(f"{source}: follow_on.min_benefit = {fo.min_benefit:g}, max_regression = {fo.max_regression:g}: "
                        f"expected at least {percent(MIN_BENEFIT)} benefit and at most {percent(MAX_REGRESSION)} "
                        f"regression (the seed's acceptance rule; a stricter bar is allowed)")
    restore_expected_s = plan.rates.restore_expected_s()
    budget = t.restore_budget()
    if not 0 < budget * 60 or budget + t.closing_drain_bound_min() > t.restore_reserve_min:
        raise PlanError(f"{source}: timing.restore_budget_min = {budget:g} with a closing drain of up to "
                        f"{t.closing_drain_bound_min():g} min does not fit timing.restore_reserve_min = {t.restore_reserve_min:g}")
    if restore_expected_s > budget * 60:
        raise PlanError(f"{source}: the restore's expected {restore_expected_s / 60:g} min (unload and load at "
                        f"rates.load_s = {plan.rates.load_s:g} s, and its checks) does not fit its budget of {budget:g} min")
    if not 0 < plan.growth.max_gpu_memory_fraction <= 1:
        raise PlanError(f"{source}: growth.max_gpu_memory_fraction = {plan.growth.max_gpu_memory_fraction}, expected in (0, 1]")
    if not 0 < plan.rates.output_share <= 1:
        raise PlanError(f"{source}: rates.output_share = {plan.rates.output_share}, expected in (0, 1]")


def _check_names(plan: Plan, source: str) -> None:
    # names become path components (report folders, fixture folders): nothing that could climb out
    if not _SAFE_NAME.fullmatch(plan.name):
        raise PlanError(f"{source}: name = {plan.name[:80]!r}: expected letters, digits, '.', '_' or '-' "
                        f"(at most 128, not starting with '.'), as it names the report's folder")
    for i, f in enumerate(plan.fixtures):
        if not _SAFE_NAME.fullmatch(f.name):
            raise PlanError(f"{source}: fixtures[{i}].name = {f.name[:80]!r}: expected letters, digits, '.', '_' "
                            f"or '-' (a fixture folder's name, not a path)")


def _check_phases(plan: Plan, source: str) -> set[str]:
    """The phases in order; the ids seen."""
    fixtures = {f.name for f in plan.fixtures}
    seen: set[str] = set()
    if not plan.phases:
        raise PlanError(f"{source}: phases: expected at least one phase")
    for i, ph in enumerate(plan.phases):
        _check_phase(plan, source, i, ph, seen, fixtures)  # adds its id to `seen`
    return seen


def _check_phase(plan: Plan, source: str, i: int, ph: PhaseSpec, seen: set[str], fixtures: set[str]) -> None:
    where = f"{source}: phases[{i}]"
    if ph.id in seen:
        raise PlanError(f"{where}.id = {ph.id!r} is used twice")
    seen.add(ph.id)
    if ph.kind == "consistency":
        ref = next((f for f in plan.fixtures if f.name == ph.fixture), None)
        if ref is None:
            raise PlanError(f"{where}.fixture = {ph.fixture!r}: expected one of the plan's fixtures {sorted(fixtures)}")
        greedy = ref.temperature if ref.temperature is not None else plan.sampling.temperature
        if greedy != 0:
            raise PlanError(f"{where}: a consistency phase needs greedy bodies: fixture {ph.fixture} asks temperature "
                            f"{greedy:g}, expected 0 (set fixtures[].temperature = 0 for a greedy fixture)")
        first = next(q for q in plan.phases if q.incarnation == ph.incarnation)
        if not (first.kind == "identity" and first.fresh) or any(
                q.kind != "identity" for q in plan.phases[:i] if q.incarnation == ph.incarnation):
            raise PlanError(f"{where}: a consistency phase runs first on a fresh incarnation (after only its fresh "
                            f"identity phase), so that its cold answers meet an empty host cache")
        if ph.concurrency != 1 or ph.passes != 1 or ph.order != "forward" or ph.select_last is not None \
                or ph.prime is not None:
            raise PlanError(f"{where}: a consistency phase sends every body once cold and once with reuse, one at a "
                            f"time: leave concurrency, passes, order, select_last and prime unset")
    if ph.kind == "replay":
        if ph.fixture not in fixtures:
            raise PlanError(f"{where}.fixture = {ph.fixture!r}: expected one of the plan's fixtures {sorted(fixtures)}")
        if ph.concurrency < 1 or ph.passes < 1:
            raise PlanError(f"{where}: concurrency and passes must be at least 1")
        if ph.select_last is not None and ph.select_last < 1:
            raise PlanError(f"{where}.select_last = {ph.select_last}, expected at least 1")
    for dep in ph.requires_measured:
        if dep not in seen:
            raise PlanError(f"{where}.requires_measured names {dep!r}, which is not an earlier phase")
    if ph.prime is not None:
        prime = next((q for q in plan.phases[:i] if q.id == ph.prime), None)
        if prime is None or prime.kind != "replay" or prime.incarnation != ph.incarnation:
            raise PlanError(f"{where}.prime = {ph.prime!r}: expected an earlier replay phase of incarnation "
                            f"{ph.incarnation!r}")


def _check_observation_trace_and_guards(plan: Plan, source: str, seen: set[str]) -> None:
    for g in plan.drain.accept_unobserved:
        if g not in DRAIN_GAUGES:
            raise PlanError(f"{source}: drain.accept_unobserved names {g!r}: expected one of {', '.join(DRAIN_GAUGES)}")
    so = plan.starting_observation
    if so is not None:
        if so.phase not in seen:
            raise PlanError(f"{source}: starting_observation.phase = {so.phase!r}: expected one of the plan's phases")
        _within(source, "starting_observation.tolerance", so.tolerance, 0, 1)
        for name in ("stores_per_request", "records", "bytes_used", "bytes_capacity", "restored_tokens"):
            v = getattr(so, name)
            if v is not None:
                _within(source, f"starting_observation.{name}", v, 0, 2**62)
    if plan.trace is not None:
        fixtures = sorted(f.name for f in plan.fixtures)
        if plan.trace.fixture not in fixtures:
            raise PlanError(f"{source}: trace.fixture = {plan.trace.fixture!r}: expected one of {fixtures}")
        if plan.trace.repetitions < 1 or not plan.trace.concurrency:
            raise PlanError(f"{source}: trace: repetitions and concurrency must be non-empty")
    try:
        check_guards(plan.guards, source)
    except GuardError as exc:
        raise PlanError(str(exc)) from None
    if not 0 < plan.sampling.top_p <= 1:
        raise PlanError(f"{source}: sampling.top_p = {plan.sampling.top_p}, expected in (0, 1]")
    if not plan.sampling.stream:  # bodies that matched it would each fail at the host, after the take-down
        raise PlanError(f"{source}: sampling.stream = false: expected true (a window reads every answer as a "
                        f"stream: its first token's time, its usage)")


def trace_arm_order(trace: TraceArms) -> list[tuple[str, int, int, bool]]:
    """The frozen alternating order: (phase id, concurrency, repetition, trace on)."""
    out = []
    for c in trace.concurrency:
        for r in range(1, trace.repetitions + 1):
            arms = (False, True) if r % 2 == 1 else (True, False)
            for on in arms:
                out.append((f"trace.C{c}.r{r}.{'on' if on else 'off'}", c, r, on))
    return out


def expected_identity(plan: Plan) -> dict[str, Any]:
    """The identity fields the plan checks (a field left out of the plan is not checked)."""
    fields: dict[str, Any] = msgspec.to_builtins(plan.identity)
    return fields
