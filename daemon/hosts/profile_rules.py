"""What a site's engine profile lets a window hold its engine to: the reuse identity its counters keep with
each request's cached_tokens, the start-up requests a fresh incarnation's counters may show, whether a
body naming a model it does not serve is refused, and whether a body must ask for its usage. Asked here, so
that nothing outside daemon/hosts/ looks an engine up by its name."""

from __future__ import annotations

from pathlib import Path

from flare_diag.daemon.hosts.engine_profiles import (FORCES_USAGE, REFUSES_UNSERVED_MODEL, REPORTS_CACHED_TOKENS_WITH,
                                                      REUSE_IDENTITY, STARTUP_REQUESTS, USAGE_ONLY_WHEN_ASKED,
                                                      metric_names)
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.localengine import LocalRecipe
from flare_diag.daemon.hosts.metrics import COUNTERS
from flare_diag.daemon.hosts.site import Site, SiteProfile


def reuse_identity(site: Site) -> list[str]:
    """The engine profile's reuse identity, as far as this site can hold it: nothing when the site
    re-mapped one of its counters (what it means is then the site's), or when a member is unmapped and
    not known to be zero; a host-tier member is dropped where the site's own recipes give the engine
    no host tier (it is 0 by configuration)."""
    p = site.profile
    names = REUSE_IDENTITY.get(p.metrics_profile, [])
    if any(COUNTERS[n][0] in p.metrics for n in names):
        return []
    mapped = metric_names(p.metrics_profile, p.metrics)
    no_tier = p.engine is not None and not any(
        LocalRecipe(n, r.args, Path(r.model), r.env, p.engine.kind).host_tier() for n, r in p.engine.recipes.items())
    out = []
    for n in names:
        if COUNTERS[n][0] in mapped:
            out.append(n)
        elif not (no_tier and n.startswith("host_")):
            return []
    return out


def startup_requests(site: Site) -> tuple[int, int]:
    """(at most, generated tokens each) of the requests the site's engine sends itself as it starts and counts
    (engine_profiles.STARTUP_REQUESTS); (0, 0) for any other engine, or where the site re-mapped a counter they
    move (what it counts is then the site's)."""
    p = site.profile
    known = STARTUP_REQUESTS.get(p.metrics_profile)
    moved = ("finished", "prompt_tokens", "generation_tokens")
    if known is None or any(COUNTERS[n][0] in p.metrics for n in moved):
        return 0, 0
    return known.at_most, known.generated_each


def refuses_unserved_model(profile: SiteProfile) -> bool:
    """Whether the engine refuses a body naming a model it does not serve (engine_profiles.REFUSES_UNSERVED_MODEL):
    then every request of such a plan would fail, and a site check must say so as a refusal."""
    return profile.metrics_profile in REFUSES_UNSERVED_MODEL


def usage_unasked(profile: SiteProfile, fixtures: dict[str, Fixture]) -> str | None:
    """The first body whose answer would carry no usage on this site's engine, which streams it only when asked
    (engine_profiles.USAGE_ONLY_WHEN_ASKED) and whose own recipes do not all force it: 'fixture F body N
    (sha256 ...)'; None when every body asks, or the engine sends usage whatever a body says."""
    if profile.metrics_profile not in USAGE_ONLY_WHEN_ASKED:
        return None
    force = FORCES_USAGE.get(profile.metrics_profile)
    if force and profile.engine is not None and profile.engine.recipes and \
            all(force in r.args for r in profile.engine.recipes.values()):
        return None
    for name in sorted(fixtures):
        i = fixtures[name].unasked_usage()
        if i is not None:
            return f"fixture {name} body {i} (sha256 {fixtures[name].sha256[i][:12]})"
    return None


def usage_unasked_words(unasked: str) -> str:
    """What a site check and a plan check say of the body usage_unasked names."""
    return (f"{unasked} does not ask for usage (\"stream_options\": {{\"include_usage\": true}}), which this engine "
            f"streams only when asked: every answer to it would carry no token counts and fail; add it to the bodies "
            f"(and their manifest's hashes)")


def cached_tokens_unreported(profile: SiteProfile) -> tuple[str, list[str]] | None:
    """(the flag, the site's local recipes that lack it) where the engine leaves each answer's cached_tokens out
    without that flag (engine_profiles.REPORTS_CACHED_TOKENS_WITH); None where the engine is not one such that the
    daemon runs itself (a remote engine's flags are not seen: its answers show it)."""
    flag = REPORTS_CACHED_TOKENS_WITH.get(profile.metrics_profile)
    if flag is None or profile.engine is None:
        return None
    return flag, sorted(n for n, r in profile.engine.recipes.items() if flag not in r.args)
