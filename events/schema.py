"""Every event type the log knows, as one msgspec tagged union (importing this registers them all)."""

from __future__ import annotations

from typing import Any

from flare_diag.events.actions import AnyAction
from flare_diag.events.base import Event, register
from flare_diag.events.upcast import register_upcaster


@register
class LogNote(Event, tag="log_note", frozen=True):
    """A free-form operator or tool note; carries no decision weight."""

    text: str
    source: str = ""


# --- Policy inputs: every one is appended before the policy sees it. `at_ns` is the window clock
# (nanoseconds since the window was opened, multiplied by the time scale of a rehearsal).

NS_PER_S = 1_000_000_000
NS_PER_MIN = 60 * NS_PER_S
MINUTE_PLACES = 4  # every minute the log, the reports and the live views show is rounded this way


def window_minute(at_ns: int, t0_ns: int | None) -> float | None:
    """The window minute of a window-clock time: minutes since t0 (the quiesce), or None before it."""
    return None if t0_ns is None else round((at_ns - t0_ns) / NS_PER_MIN, MINUTE_PLACES)

class Input(Event, kw_only=True, frozen=True):
    """Base of everything the window policy receives."""

    at_ns: int


@register
class WindowOpened(Input, tag="window_opened", frozen=True):
    """The operator's start: the plan (as decoded builtins), where it runs, and how GPUs are read."""

    window_id: str
    plan: dict[str, Any]
    plan_sha256: str
    site: str
    gpu_source: str
    rehearsal: bool
    candidate_recipe: str
    # What the daemon needs to pick the window up again after a restart (paths, never secrets).
    time_scale: float = 1.0
    site_profile: str = ""
    fixture_dirs: list[str] = []
    # What the estimates start from besides the plan's rates: an earlier window's log, or a
    # rehearsal's probe (policies.planner.Calibration as builtins).
    calibration: dict[str, Any] = {}
    # What a recovery compares before it trusts a replay: the policy's source, the site profile as
    # read (restored from, never re-read, if the file changed since) and each fixture's bodies.
    policy_sha256: str = ""
    site_profile_sha256: str = ""
    site_profile_toml: str = ""
    fixtures_sha256: dict[str, str] = {}
    # set when the last window in this log did not verify its restore: the incumbent it recorded,
    # which must be what is loaded before another window may start
    expected_incumbent_sha256: str = ""
    # a rehearsal's clock: "virtual" (the simulator's model of service time; the same seed gives the
    # same window anywhere) or "wall" (a live-paced rehearsal, and every window on a real site), and
    # the seed its simulator drew service-time noise from
    clock: str = "wall"
    sim_seed: int | None = None
    # the site's Prometheus is there to evaluate the plan's steady-state guards (a model run, which
    # has none, opens its windows without it: its guards are neither evaluated nor depended on)
    steady_state: bool = False
    # the review that let a production plan run: by, note, and where it is recorded (log, seq, hash)
    review: dict[str, Any] = {}
    # the counters whose C1 deltas the engine's own per-request `cached_tokens` must equal (the engine
    # profile's REUSE_IDENTITY: vLLM's stats.py invariant); empty: the engine states none, nothing checked
    reuse_identity: list[str] = []
    # the requests the engine sends itself as it starts, which its counters count (the engine profile's
    # STARTUP_REQUESTS: SGLang's warm-up): at most this many, each with at most `startup_generated_each`
    # generated tokens, may show on a fresh incarnation whose counters are otherwise at zero; 0: none may
    startup_requests: int = 0
    startup_generated_each: int = 0


@register
class Tick(Input, tag="tick", frozen=True):
    """The passage of time; carries nothing but `at_ns`."""


@register
class ActionDone(Input, tag="action_done", frozen=True):
    """The outcome of one requested action. `error` classifies a failure (see policies.rules)."""

    action_id: int
    ok: bool
    error: str | None = None
    detail: str = ""
    data: dict[str, Any] = {}
    # a read of the engine that failed in transport: what `GET /health` then answered (its status), or why it
    # could not be read ("no connection", a failure's class); None where it was not asked (logs before 2026-12-07)
    health_after: int | str | None = None


@register
class RequestDone(Input, tag="request_done", frozen=True):
    """The outcome of one replayed request; timings are monotonic ns relative to its send."""

    action_id: int
    phase: str
    order_index: int
    body_index: int
    body_sha256: str
    outcome: str  # ok | error | cancelled
    error: str | None = None
    detail: str = ""
    status_code: int | None = None
    request_id: str | None = None
    finish_reason: str | None = None
    visible_output: bool = False
    reasoning_only: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    # where first_token_ns came from: "kernel", the receive stamp of its bytes; "read", when they were read
    # off the connection (later, on a busy daemon); "" for a host in this process, or a log older than it
    first_token_stamp: str = ""

    last_token_ns: int | None = None
    end_ns: int | None = None
    response_bytes: int = 0
    response_sha256: str = ""
    response_head: str = ""
    # the generated text alone (reasoning, then content, each delta tagged): equal answers hash equal
    # whatever the stream's ids and chunking; "" where it was not read (a failed request, a model run)
    output_sha256: str = ""
    # the model the body asked for and the one the answer named, only where the engine's answer names the
    # model that served it (vLLM: daemon/hosts/engine_profiles.py, ANSWER_NAMES_SERVED_MODEL); "" elsewhere
    model_asked: str = ""
    model_answered: str = ""
    # the completion id every chunk of its answer named (target.py holds a stream to one); "" where none was
    # named or read. A generation's id is its own: an id an earlier answer on the incarnation had is a replay
    answer_id: str = ""
    # a request that failed in transport: what `GET /health` then answered, as ActionDone's
    health_after: int | str | None = None


@register
class WatchObserved(Input, tag="watch_observed", frozen=True):
    """An unsolicited observation from a watcher (source: gpu | router | identity)."""

    source: str
    data: dict[str, Any]


@register
class WatchFailed(Input, tag="watch_failed", frozen=True):
    """A watcher's poll that got no answer (source: gpu | router | identity); silence past the plan's
    `timing.watch_lost_s` aborts with `watch_lost`."""

    source: str
    error: str
    detail: str = ""


@register
class OperatorAbort(Input, tag="operator_abort", frozen=True):
    """An operator's `abort` over the control socket, with the caller's uid and pid as the socket saw them."""

    reason: str
    uid: int | None = None
    pid: int | None = None


@register
class LogUnwritable(Input, tag="log_unwritable", frozen=True):
    """The event log stopped accepting commits; the window goes on from memory into its restore,
    and everything from the first unwritten event is appended again once the log takes it."""

    detail: str


@register
class LogArchived(Event, tag="log_archived", frozen=True):
    """Rows up to `last_seq` (whose hash is `head_hash`) moved to the archive log `archive`: the
    live log's chain goes on from there (events/archive.py)."""

    archive: str
    first_seq: int
    last_seq: int
    head_hash: str
    windows: list[str]
    events: int


@register
class ReviewSigned(Event, tag="review_signed", frozen=True):
    """A person's review of a plan's exact bytes and of every fixture's manifest (the seed: "lead research
    plus independent plan/fixture review"), or of a follow-on's source window and policy change. A
    production plan runs only with a review of exactly its bytes by someone other than its `author`."""

    subject: str  # plan | follow_on
    plan_name: str
    plan_sha256: str
    author: str
    fixtures: dict[str, str]  # fixture name -> sha256 of its manifest.json
    by: str
    note: str = ""
    uid: int | None = None  # the caller's, as the control socket saw it (None: signed offline into a log)
    source_window: str = ""  # a follow-on's: the window its plan was derived from
    policy: str = ""  # a follow-on's: the policy change under review (the candidate eviction policy, or "nsight")


@register
class HarnessRehearsed(Event, tag="harness_rehearsed", frozen=True):
    """The offline harness run on the window's own plan and fixture bytes before any host change (the
    seed: "validate existing offline harness and new HTTP-only replay fixture"): a virtual-time rehearsal
    against the embedded simulator, its outcome, its log's head hash and its forecast's last minute."""

    plan_sha256: str
    fixtures: dict[str, str]
    scenario: str
    outcome: str
    verdict: str
    log_head_seq: int
    log_head_hash: str
    forecast: str
    wall_s: float
    folder: str = ""  # where the rehearsal's log and report are (an earlier window's, when it validated these bytes)


@register
class PreservedChecked(Event, tag="preserved_checked", frozen=True):
    """The plan's preserved history (`[preserve] paths`) hashed: `when` before anything changed, or after
    the reports were published; each path -> {"sha256" (None: missing), "unchanged" (after only)}."""

    when: str  # before | after_publishing
    paths: dict[str, dict[str, Any]]


@register
class FaultScheduled(Event, tag="fault_scheduled", frozen=True):
    """A rehearsal's injected fault (`--fault`), before the window opens: the spec as given, its kind, the
    moment it is bound to (`"now"`, {"phase", "request"}, {"request"}, {"after_s"}, {"before_load"}, ...)
    and its parameters. The simulated host only: a live window never injects anything."""

    spec: str
    kind: str
    at: str | dict[str, Any]
    params: dict[str, Any] = {}


@register
class FaultsAccounted(Event, tag="faults_accounted", frozen=True):
    """Once a rehearsal window has closed: each scheduled fault (its spec) and whether the simulated host
    fired it. A fault that never fired tested nothing, and the report says so."""

    faults: list[dict[str, Any]]  # {"spec", "fired"}


@register
class LeaseGranted(Event, tag="lease_granted", frozen=True):
    """The fleet's pool lease this window runs under, as granted before anything changed: its fencing
    epoch (contract 4, amended 2026-12-03). Every host change of the window follows it in the chain; the
    daemon re-asserts the lease (host, window, epoch) against the fleet database while the window runs."""

    pool: str
    host: str
    epoch: int
    how: str  # taken | kept (a daemon resuming its own window)


@register
class CampaignRunStarted(Event, tag="campaign_run_started", frozen=True):
    """The fleet campaign's run this window is, written before any host change: the host's own log names
    the run's window even when the fleet database never heard it (a "running" mark lost to a failover),
    so the run is marked from the log and never started twice."""

    campaign: int
    run: int
    claim_us: int = 0  # the claim it ran under (the run's claimed_at, us): a run requeued since is run again


@register
class ProbeSent(Event, tag="probe_sent", frozen=True):
    """A forecast probe's generation, logged before it goes out (its answer is the `probe_request` after
    it): a daemon that dies mid-probe leaves in its log every request it may have sent a live primary."""

    site: str
    fixture: str
    body_index: int
    body_sha256: str


@register
class ProbeRequest(Event, tag="probe_request", frozen=True):
    """A generation sent outside any window: the forecast's pace probe, before a window opens (opt-in
    per site). Logged like every other request the daemon sends; no decision reads it."""

    site: str
    fixture: str
    body_index: int
    body_sha256: str
    outcome: str  # ok | error
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    elapsed_s: float | None = None
    error: str | None = None


@register
class ControlCommand(Event, tag="control_command", frozen=True):
    """A control-socket command that changes something, with the caller's SO_PEERCRED identity."""

    cmd: str
    uid: int
    pid: int
    ok: bool
    detail: str = ""


@register
class DaemonRestarted(Input, tag="daemon_restarted", frozen=True):
    """The daemon came back with this window unfinished; unanswered actions are possibly done."""

    unanswered: list[int] = []
    # what differs from the window as opened or as recorded (policy version, site profile, fixtures,
    # replayed decisions); the window restores either way, and raises `resume_mismatch` for these
    mismatches: list[str] = []


# --- Policy decisions: appended before they are carried out.

class Decision(Event, kw_only=True, frozen=True):
    """Base of everything the window policy decides."""


@register
class ActionRequested(Decision, tag="action_requested", frozen=True):
    """An action the policy asks for, as data (events/actions.py). v2: `request` is the typed action;
    v1 logs held its name and arguments apart (`action`, `args`) and are lifted by the upcaster below."""

    schema_v = 2  # a class constant the base declares ClassVar; this type's own version
    action_id: int
    request: AnyAction
    experimental: bool = False
    deadline_s: float | None = None  # window seconds the runner gives it before it fails as `timeout`

    @property
    def action(self) -> str:
        return self.request.name

    @property
    def args(self) -> dict[str, Any]:
        return self.request.args()


@register_upcaster("action_requested", 1)
def _action_requested_v1(raw: dict[str, Any]) -> dict[str, Any]:
    raw["request"] = {"action": raw.pop("action"), **(raw.pop("args", None) or {})}
    return raw


@register
class CancelRequested(Decision, tag="cancel_requested", frozen=True):
    """In-flight actions the policy gives up when the restore begins: experimental requests and reads, so
    that a hung one cannot hold the restore reservation (`reason`: the restore's cause)."""

    action_ids: list[int]
    reason: str


@register
class TimeMarked(Decision, tag="time_marked", frozen=True):
    """A point of the window timeline (t0, stop, window_end, restore_overrun)."""

    mark: str
    minute: float


@register
class TraceOrderFrozen(Decision, tag="trace_order_frozen", frozen=True):
    """The trace arms' order (off/on pairs, balanced by repeat), fixed before the first snapshot so that a
    replay of the log runs them in the same order."""

    order: list[str]


@register
class ArmStarted(Decision, tag="arm_started", frozen=True):
    """An arm passed its gate: by the estimate now, its gating phases end by `limit_minute`."""

    arm: str
    phases: list[str]
    minute: float
    estimated_end_minute: float
    limit_minute: float
    pace: float
    overhead_s: float


@register
class PhaseStarted(Decision, tag="phase_started", frozen=True):
    """A phase begins, at this window minute, with the estimate of when it ends."""

    phase: str
    minute: float
    estimated_end_minute: float


@register
class RequestMeasured(Decision, tag="request_measured", frozen=True):
    """One request's native counter deltas, from the scrapes before and after it."""

    phase: str
    order_index: int
    body_index: int
    body_sha256: str
    outcome: str
    natural_failure: str | None
    delta: dict[str, Any]


@register
class CellRecorded(Decision, tag="cell_recorded", frozen=True):
    """One cell's result: a phase's requests and counter deltas, or why it was not measured (failed,
    invalid, deferred). The verdict is decided from these."""

    phase: str
    status: str  # measured | failed | invalid | deferred
    reason: str
    requests: int = 0
    host: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    comparable: bool = True
    counters: dict[str, Any] = {}
    natural_failures: int = 0
    started_minute: float | None = None
    estimated_end_minute: float | None = None
    ended_minute: float | None = None
    # chained validity (contract 4, amended 2026-12-01): the phase whose state a replay reads, the
    # incarnation the phase ran on, and whether the identity read at its close was the one verified
    # for that incarnation (None: not read, e.g. a phase that never ran)
    prime: str | None = None
    incarnation_id: str | None = None
    identity_held: bool | None = None
    hit_requests: list[int] = []  # order indices whose own counter delta showed a host hit (C1)
    drain_unseen: list[str] = []  # drain gauges the host does not expose, accepted by the plan
    # its incarnation did not start cold (counters not reset, host cache occupied, or its first request found
    # the host cache not empty): a mark the verdict's next step reads, so that it asks for a cold start first
    not_fresh: bool = False
    # an output-consistency phase's finding (policies/consistency.judge): bodies compared, reused on
    # the warm pass, and those answered differently
    consistency: dict[str, Any] | None = None


@register
class AbortDecided(Decision, tag="abort_decided", frozen=True):
    """The policy aborts the experiment: the rule that fired (`reason`, one of policies.rules.ABORT_REASONS,
    such as `gpu_fault`, `identity_drift`, `watch_lost`, `operator`) and what it saw. The restore follows."""

    reason: str
    detail: str
    minute: float | None


@register
class DrainObserved(Decision, tag="drain_observed", frozen=True):
    """How a drain check ended: settled (gauges idle, counters stable) or timed out, and how long it took."""

    purpose: str  # quiesce | before PHASE | after PHASE
    settled: bool
    waited_s: float  # window seconds
    polls: int
    minute: float | None


@register
class RestoreStarted(Decision, tag="restore_started", frozen=True):
    """The restore of the incumbent begins, and why: the experiments completed, the stop minute came, or
    an abort."""

    cause: str  # completed | stop_minute | abort
    minute: float | None


@register
class RestorationRecorded(Decision, tag="restoration_recorded", frozen=True):
    """What the restore checked of the incumbent it brought back (its sha256 and identity, containment,
    monitoring, a direct and a routed preflight, readmission, no fault during the restore, the
    reservation kept; None: not applicable to this site), and whether every check held."""

    checks: dict[str, Any]
    verified: bool
    started_minute: float | None
    finished_minute: float | None


@register
class VerdictReached(Decision, tag="verdict_reached", frozen=True):
    """The hypothesis the measured cells support (or `inconclusive`), the basis in numbers, the next
    experiment the seed's method names, and the findings beside it."""

    hypothesis: str
    basis: str
    next_experiment: str
    findings: list[str] = []


@register
class BoundsScaled(Decision, tag="bounds_scaled", frozen=True):
    """The bounds a real-seconds floor raised under a scaled clock, as the window opened (contract 4,
    amended 2026-12-03): each {"bound", "plan_s", "effective_s", "reason"}. Never at x1."""

    bounds: list[dict[str, Any]]


@register
class Alarm(Decision, tag="alarm", frozen=True):
    """Something a person must hear about that is not an abort (a restore overrun, a resume mismatch, a
    primary left quiesced, a rule disabled, a guard's dry run...): `kind` names it."""

    kind: str
    detail: str


@register
class WindowClosed(Decision, tag="window_closed", frozen=True):
    """The window ends: completed, aborted (the incumbent restored either way) or restore_failed (the
    primary needs a person)."""

    outcome: str  # completed | aborted | restore_failed
    minute: float | None
