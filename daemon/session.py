"""One window's lifecycle, the same whoever drives it (the daemon or a foreground `run`/`rehearse`/resume):
the read-only checks and the forecast, the window opened in a log and run (or resumed), the host let go,
and the preserved history checked once the reports are out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flare_diag.daemon.hosts.target import Target
from flare_diag.daemon.rehearsal.harness import after_publishing, preconditions
from flare_diag.daemon.window.forecast import planned
from flare_diag.daemon.window.runner import Runner
from flare_diag.daemon.window.setup import WindowSetup
from flare_diag.daemon.window.sitecheck import checked_target
from flare_diag.events.base import Event
from flare_diag.events.store import EventStore
from flare_diag.policies.planner import Schedule

Append = Callable[[Event], Awaitable[object]]


@dataclass
class Places:
    """Where a window's files go besides its log."""

    recipes: Path  # the recipe bytes retained before the take-down
    harness: Path  # the offline harness's rehearsal of a production plan
    outputs: list[Path] = field(default_factory=list)  # folders the preserved history may not lie in
    plan_dir: Path | None = None  # what the plan's relative preserve paths are relative to
    harness_cache: Path | None = None
    earlier: tuple[Path, str | None] | None = None  # an earlier window on this site: (its log, its id)


class WindowSession:
    """A window from its site check to the check after publishing. Nothing on the host changes before
    `run` (or `resume`); every failure before it closes the host's connections and says why (InputError
    for what the operator can fix), and `close` is always the caller's last call."""

    def __init__(self, setup: WindowSetup, target: Target | None = None) -> None:
        self.setup = setup
        self.target = target
        self.runner: Runner | None = None
        self.window_id = ""

    @classmethod
    def resuming(cls, setup: WindowSetup, recipes: Path) -> WindowSession:
        """An unfinished window picked up from its log: no checks and no forecast, straight to its restore."""
        return cls(setup, Target(setup.site, setup.fixtures, setup.plan_sha256, recipe_dir=recipes))

    async def prepare(self, places: Places, probe_log: Append | None) -> Schedule:
        """The read-only part, in order: the site check (the same as `site check`), the preserved history
        hashed and the offline harness rehearsed, then the forecast (its probe requests to `probe_log`,
        intent first and answer after, as they are sent). InputError refuses the window."""
        setup = self.setup
        self.target = await checked_target(setup, places.recipes)
        try:
            await preconditions(setup, places.harness, places.outputs, places.plan_dir, places.harness_cache,
                                places.earlier)
            setup.probe_log = probe_log
            return await planned(setup, self.target)
        except BaseException:
            await self.close()
            raise

    async def open(self, store: EventStore, window_id: str, before: Sequence[Event] = ()) -> Runner:
        """The window's runner on `store`, with what was done before it opened (the preconditions, then
        `before`: a lease, a campaign run, the command that started it) in its log ahead of it."""
        assert self.target is not None, "prepare (or resuming) gives the session its host first"
        first = [*self.setup.preconditions, *before]
        if first:
            await store.append_many(first, window_id=window_id)
        self.window_id = window_id
        self.runner = Runner(store, self.target, window_id, self.setup.time_scale)
        return self.runner

    async def run(self) -> str:
        assert self.runner is not None, "open comes first"
        return await self.runner.run(self.setup.opened(self.window_id))

    async def resume(self, events: list[tuple[int, Event]], opened_wall_ns: int,
                     mismatches: list[str]) -> str:
        """The recorded inputs replayed into a fresh decider, then straight to its restore."""
        assert self.runner is not None, "open comes first"
        return await self.runner.resume(events, opened_wall_ns, mismatches)

    async def close(self) -> None:
        """The host's connections let go; idempotent."""
        if self.target is not None:
            await self.target.close()

    async def after_publishing(self, append: Append) -> bool:
        """The preserved history hashed again once the reports are out, into the window's log (`append`);
        False when the plan preserves nothing."""
        return await after_publishing(self.setup, append)
