"""The host's answers as data: one msgspec struct per action's answer (contract section 1), decoded where
an answer meets the window, so that no reader of one guesses its keys.

Each struct names the fields a window reads, with the types the contract gives them; a host may send
more (an engine's identity carries its own fields), and those stay in the log as the host sent them:
the log keeps an answer's JSON whole, and a reader decodes it with `read` into the struct its action
answers with. An answer that does not decode (a field of the wrong type, a list where an object
belongs) is the host's malformed answer: `decode` names the action and the field, and the window
takes it as a failed action (`malformed_transport`), never as a partial answer.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from flare_diag.events import actions as act

A = TypeVar("A", bound="Answer")
Number = int | float


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every answer: unknown fields are allowed (and kept in the log, not in the struct)."""


class FixturesWork(Answer, frozen=True):
    """validate_fixtures: per fixture the work its bodies ask for, as the planner reads it."""

    fixtures: dict[str, Any] = {}


class LoadedRecipe(Answer, frozen=True):
    """The recipe a manager has loaded: `GET /manager/v1/state`'s `loaded`."""

    recipe: str | None = None
    sha256: str | None = None
    # a name, as the cells record it (`cell_recorded.incarnation_id` is a string): a number here would
    # be written into a cell the log could then not read back
    incarnation: str | None = None


class ManagerState(Answer, frozen=True):
    """`GET /manager/v1/state`."""

    loaded: LoadedRecipe | None = None
    busy: bool | None = None

    def recipe_loaded(self) -> LoadedRecipe | None:
        """What is loaded; None when `loaded` names nothing (null, or `{}`)."""
        return self.loaded if self.loaded != LoadedRecipe() else None


class Preview(Answer, frozen=True):
    """`POST /manager/v1/preview`: whether the change would be carried out, and its steps."""

    ok: bool | None = None
    steps: list[Any] = []


class Incarnation(Answer, frozen=True):
    """`POST /manager/v1/load` and `/unload`: the incarnation it made (or left)."""

    incarnation: str | None = None


class RecipeKept(Answer, frozen=True, kw_only=True):
    """retain_recipe: the recipe's bytes fetched, checked against their sha256 and kept."""

    recipe: str | None = None
    sha256: str
    bytes: int
    path: str | None = None  # where the bytes are kept (a site check keeps none)


class GpuIdentity(Answer, frozen=True):
    uuid: str | None = None
    power_limit_w: Number | None = None


class BuildIdentity(Answer, frozen=True):
    """The identity's build and configuration fields (contract section 1): what a plan's `[identity]`
    holds a host to (policies/plan.py's ExpectedIdentity) and what every identity read is compared on."""

    image: str | None = None
    flare_commit: str | None = None
    package: str | None = None
    model: str | None = None
    tensor_parallel: int | None = None
    draft_tokens: int | None = None
    host_cache_bytes: int | None = None
    disk_cache_enabled: bool | None = None
    capture_enabled: bool | None = None


class Identity(BuildIdentity, frozen=True):
    """`GET /flare/v1/identity` (and `POST /flare/v1/trace`'s answer): the contract's fields; an
    engine's own (a vLLM's version, its KV cache's geometry) ride along in the log."""

    trace_enabled: bool | None = None
    gpus: list[GpuIdentity] = []
    recipe: str | None = None
    recipe_sha256: str | None = None
    incarnation: str | None = None


class MetricsSample(Answer, frozen=True):
    """scrape_metrics: `/metrics` read into contract names (None: this engine does not export it)."""

    counters: dict[str, Number | None] = {}
    gauges: dict[str, Number | None] = {}
    labels: dict[str, Any] = {}


class Backend(Answer, frozen=True):
    """A router's backend: `POST /router/v1/backends/{id}/quiesce` and `/readmit` answer with it."""

    id: str | None = None
    url: str | None = None
    admitted: bool | None = None
    inflight: int | None = None  # the routed requests in flight: a count (docs/host-api.md)


class RouterView(Answer, frozen=True):
    """snapshot router: the router's configuration hash and the primary's backend."""

    config_sha256: str | None = None
    backend: Backend = Backend()


class MonitoringTarget(Answer, frozen=True):
    id: str | None = None
    url: str | None = None
    registered: bool | None = None
    healthy: bool | None = None


class MonitoringView(Answer, frozen=True):
    """snapshot monitoring: the primary's target, None when monitoring does not list it."""

    target: MonitoringTarget | None = None


class GpuSample(Answer, frozen=True):
    uuid: str | None = None
    power_limit_w: Number | None = None
    memory_used_bytes: Number | None = None
    memory_total_bytes: Number | None = None


class XidEvent(Answer, frozen=True):
    gpu: str | int | None = None
    xid: int | None = None
    wall_ns: int | None = None


class GpuView(Answer, frozen=True):
    """snapshot gpu and the GPU watch: the GPUs' memory and power limits, and every Xid seen."""

    gpus: list[GpuSample] = []
    xid_events: list[XidEvent] = []
    unsupported: list[str] = []
    xid_watch_error: str | None = None


class Configuration(Answer, frozen=True):
    """snapshot configuration: what the window was started with."""

    site: str | None = None
    site_sha256: str | None = None
    plan_sha256: str | None = None


class IncumbentSnapshot(LoadedRecipe, frozen=True):
    """snapshot incumbent: the loaded recipe and the engine's identity, read before anything changes."""

    identity: Identity = Identity()
    busy: bool | None = None  # the manager's own word that a load or unload is running (None: it did not say)


class Health(Answer, frozen=True, kw_only=True):
    """`GET /health`'s status: 200 when an incarnation is loaded and ready."""

    status: int


class Preflight(Answer, frozen=True):
    """One short generation's finish reason and the host's request id."""

    finish_reason: str | None = None
    request_id: str | None = None


class GuardAnswer(Answer, frozen=True):
    """One steady-state guard's query: its finite values and how many series; or why it failed."""

    values: list[Number] = []
    series: int | None = None
    error: str | None = None


class SteadyState(Answer, frozen=True):
    when: str | None = None
    guards: dict[str, GuardAnswer] = {}


_SNAPSHOTS: dict[str, type[Answer]] = {"incumbent": IncumbentSnapshot, "router": RouterView,
                                       "monitoring": MonitoringView, "gpu": GpuView, "configuration": Configuration}
_BY_ACTION: dict[type[act.Action], type[Answer]] = {
    act.ValidateFixtures: FixturesWork, act.RetainRecipe: RecipeKept, act.Preview: Preview,
    act.Quiesce: Backend, act.Readmit: Backend, act.Unload: Incarnation, act.Load: Incarnation,
    act.ReadIdentity: Identity, act.SetTrace: Identity, act.ScrapeMetrics: MetricsSample,
    act.ManagerState: ManagerState, act.Health: Health, act.Preflight: Preflight, act.SteadyState: SteadyState,
}
WATCHES: dict[str, type[Answer]] = {"gpu": GpuView, "router": RouterView, "identity": Identity}


class UnexpectedAnswer(ValueError):
    """An answer that is not the shape its action answers with: the host's, and malformed."""


def snapshot_type(what: str) -> type[Answer]:
    """The struct a snapshot of `what` answers with."""
    return _SNAPSHOTS[what]


def answer_type(request: act.Action) -> type[Answer] | None:
    """The struct `request`'s answer decodes into; None for send_request (its outcome is a request_done)."""
    if isinstance(request, act.Snapshot):
        return snapshot_type(request.what)
    return _BY_ACTION.get(type(request))


def decode(request: act.Action, data: Any) -> Answer | None:
    """`data` as `request`'s answer; UnexpectedAnswer names the action and what in it is wrong."""
    kind = answer_type(request)
    return None if kind is None else convert(kind, data, request.name)


def convert(kind: type[A], data: Any, what: str) -> A:
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise UnexpectedAnswer(f"{what}: the answer is not {kind.__name__} ({exc})") from None


def read(kind: type[A], res: Any) -> A:
    """An ok outcome's data as `kind`: the window decoded it when it arrived (WindowPolicy), so for an
    answer the window accepted this cannot fail. Only an ok outcome has an answer to read."""
    if not res.ok:
        raise ValueError(f"action {res.action_id} failed: it has no answer to read")
    return convert(kind, res.data, kind.__name__)
