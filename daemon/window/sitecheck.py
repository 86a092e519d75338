"""`site check`: a read-only probe of every endpoint a window will use, per capability the plan needs.

Nothing is changed on the host: no load, unload, quiesce, readmit, trace toggle or generation (the trace
switch is set to the state it already reports, which changes nothing). The
previews it sends are side-effect free by contract section 1. A site whose engine the daemon runs
itself ([engine]) is brought to the state a window finds it in (its incumbent running), as the
window itself would, since there is nothing to probe otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from flare_diag.daemon.hosts import request_schema
from flare_diag.daemon.hosts.profile_rules import (cached_tokens_unreported, refuses_unserved_model, usage_unasked,
                                                    usage_unasked_words)
from flare_diag.daemon.hosts.errors import ActionFailed, classify_exception, no_connection_made
from flare_diag.daemon.hosts.site import scrub
from flare_diag.daemon.hosts.target import Target
from flare_diag.daemon.window.setup import InputError, WindowSetup
from flare_diag.policies import guards, steady
from flare_diag.policies.plan import Plan, expected_identity
from flare_diag.policies.rules import DRAIN_GAUGES, IDENTITY_FIELDS

OBSERVABLE, NOT_OBSERVABLE, NOT_APPLICABLE = "observable", "not observable", "not applicable"

COUNTERS = ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens", "gpu_hits",
            "gpu_reused_tokens", "stores", "evictions", "compactions", "prompt_tokens", "generation_tokens")
OCCUPANCY = ("host_cache_records", "host_cache_bytes_used", "host_cache_bytes_capacity", "rows_used", "rows_capacity",
             "pages_used", "pages_capacity", "resident_bytes")


@dataclass
class Capability:
    name: str
    status: str          # observable | not observable | not applicable
    reason: str
    required: bool = False
    fits: bool = True    # False: observable, but not what the plan needs (e.g. an identity that differs)

    @property
    def missing(self) -> bool:
        return self.required and (self.status == NOT_OBSERVABLE or not self.fits)


@dataclass
class SiteCheck:
    site: str
    plan: str | None
    capabilities: list[Capability] = field(default_factory=list)
    services: dict[str, str] = field(default_factory=dict)  # service -> why it could not be probed at all

    @property
    def missing(self) -> list[str]:
        return [f"{s} (service)" for s in self.services] + [c.name for c in self.capabilities if c.missing]

    @property
    def ready(self) -> bool:
        return not self.missing

    def summary(self) -> str:
        counts = {s: sum(c.status == s for c in self.capabilities) for s in (OBSERVABLE, NOT_OBSERVABLE, NOT_APPLICABLE)}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items())
        if self.ready:
            return f"site check: ready: everything the plan needs is observable on site {self.site} ({tally})"
        # every line that holds the window back says why: the operator reading `run`'s one-line refusal
        # should not need a second command to learn what to mend
        why = [*self.services.values(), *(f"{c.name}: {c.reason}" for c in self.capabilities if c.missing)]
        return (f"site check: NOT READY: site {self.site} lacks what the plan needs: {', '.join(self.missing)} "
                f"({tally})" + "".join(f"; {_one_line(w)}" for w in why))

    def as_dict(self) -> dict:
        return {"site": self.site, "plan": self.plan, "ready": self.ready, "missing": self.missing,
                "services": self.services, "capabilities": [{**asdict(c), "missing": c.missing} for c in self.capabilities]}


def _one_line(reason: str, most: int = 400) -> str:
    """A reason as one bounded line: an engine's log tail or a service's error may carry newlines or run long."""
    flat = " ".join(reason.split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


class _ServiceDown(Exception):
    pass


class _Probe:
    def __init__(self, target: Target, plan: Plan | None) -> None:
        self.t = target
        self.plan = plan
        self.out = SiteCheck(target.site.name, plan.name if plan else None)

    def add(self, name: str, status: str, reason: str, required: bool = False, fits: bool = True) -> None:
        # a host's words may carry the credential it was sent: scrubbed as they are kept, so that no reader of
        # the check (its table, its JSON, `run`'s one-line refusal) can print one
        self.out.capabilities.append(Capability(name, status, scrub(reason, self.t.site.tokens.values()), required, fits))

    async def call(self, service: str, coro):
        """One probe; a refused token or an unreachable service is recorded once, for the service."""
        try:
            return await coro
        except (ActionFailed, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            f = classify_exception(exc, service)
            if f.error == "authentication":
                tf = self.t.site.token_files.get(service, "no token file")
                self.out.services[service] = f"{service}: the service refused the token from {tf} (401)"
                raise _ServiceDown from None
            if f.error == "transport":
                url = getattr(getattr(self.t.p, service, None), "url", "?")
                why = f.detail.split(": ", 1)[-1]
                # a connection nobody accepted is a service unreachable; one accepted, then closed or held
                # without an answer, is a service that is there and did not answer
                seen = "unreachable at" if no_connection_made(f) else "no answer from"
                self.out.services[service] = scrub(f"{service}: {seen} {url} ({why})", self.t.site.tokens.values())
                raise _ServiceDown from None
            raise ActionFailed(f.error, f.detail) from None

    async def run(self) -> SiteCheck:
        for step in (self.serving, self.metrics, self.manager, self.router, self.monitoring, self.gpu, self.steady_state):
            try:
                await step()
            except _ServiceDown:
                continue
            except ActionFailed as exc:  # a failure no step expected: one required line, never a traceback
                self.add(step.__name__, NOT_OBSERVABLE, exc.detail, required=True)
        return self.out

    # --- serving --------------------------------------------------------------------------

    async def serving(self) -> None:
        t = self.t
        try:
            await t.manager.prepare()  # a local engine is brought to the state a window finds it in
        except ActionFailed as exc:
            self.add("serving.health", NOT_OBSERVABLE, f"the site's incumbent could not be started: {exc.detail}",
                     required=True)
            raise _ServiceDown from None
        code = (await self.call("serving", t.health({})))["status"]
        self.add("serving.health", OBSERVABLE if code == 200 else NOT_OBSERVABLE,
                 "an incarnation is loaded and ready" if code == 200 else f"/health answered {code}",
                 required=True)
        try:
            ident = await self.call("serving", t.read_identity({}))
        except ActionFailed as exc:
            self.add("serving.identity", NOT_OBSERVABLE, exc.detail, required=True)
            return
        expected = {} if self.plan is None else expected_identity(self.plan)
        for f in IDENTITY_FIELDS:
            self._field(f"identity.{f}", ident, f, expected)
        for f in ("recipe_sha256", "incarnation"):
            have = ident.get(f) is not None
            self.add(f"identity.{f}", OBSERVABLE if have else NOT_OBSERVABLE,
                     str(ident.get(f)) if have else "not in the identity reply; fresh incarnations cannot be verified",
                     required=True)
        gpus = ident.get("gpus")
        if gpus is None:
            self.add("identity.gpus", NOT_OBSERVABLE, "no gpus in the identity reply", required="gpu_count" in expected)
        else:
            want_n, want_w = expected.get("gpu_count"), expected.get("gpu_power_limit_w")
            watts = sorted({g.get("power_limit_w") for g in gpus}, key=str)
            fits = (want_n is None or len(gpus) == want_n) and (want_w is None or watts == [want_w])
            self.add("identity.gpus", OBSERVABLE, f"{len(gpus)} GPUs at {'/'.join(map(str, watts)) or '-'} W"
                     + ("" if fits else f"; the plan expects {want_n} at {want_w} W"), required=True, fits=fits)
        await self._served_model()
        await self._bodies_accepted()
        self._usage_asked()
        self._cached_tokens_reported()
        trace = self.plan is not None and self.plan.trace is not None
        if not t.serving.trace_switch:
            self.add("serving.trace_switch", NOT_APPLICABLE, "this engine has no request-trace switch")
        else:
            await self._trace_switch(ident, trace)

    async def _trace_switch(self, ident: dict, trace: bool) -> None:
        """The switch set to the state the identity reports (a set, not a toggle: nothing changes), so a
        host that refuses the endpoint (404) is found here and not by the first trace arm."""
        arms = "" if trace else "; the plan has no trace arms"
        if not isinstance(ident.get("trace_enabled"), bool):
            self.add("serving.trace_switch", NOT_OBSERVABLE, "no trace_enabled in the identity reply" + arms, required=trace)
            return
        try:
            await self.call("serving", self.t.set_trace({"enabled": ident["trace_enabled"]}))
        except ActionFailed as exc:
            self.add("serving.trace_switch", NOT_OBSERVABLE, f"setting it to its present state failed: {exc.detail}" + arms,
                     required=trace)
            return
        self.add("serving.trace_switch", OBSERVABLE, f"answers; left as it was (trace_enabled = {ident['trace_enabled']})"
                 + arms, required=trace)

    async def _bodies_accepted(self) -> None:
        """Every fixture body against the engine's own request schema (`/openapi.json`), before anything
        changes: a body it would refuse (400) fails its phase wholesale, found here instead."""
        if not self.t.fixtures:
            return
        try:
            doc = await self.call("serving", self.t.openapi())
        except ActionFailed as exc:
            self.add("serving.request_schema", NOT_OBSERVABLE, exc.detail)
            return
        if doc is None:
            self.add("serving.request_schema", NOT_OBSERVABLE, "no /openapi.json: a body the engine refuses is found "
                     "only when its phase's first request is refused")
            return
        try:
            refused = request_schema.refusals(request_schema.chat_validator(doc), self.t.fixtures)
        except request_schema.SchemaUnusable as exc:
            self.add("serving.request_schema", NOT_OBSERVABLE, f"/openapi.json: {exc}")
            return
        n = sum(len(f.bodies) for f in self.t.fixtures.values())
        self.add("serving.request_schema", OBSERVABLE,
                 f"the engine's schema accepts all {n} bodies" if not refused else
                 f"the engine's schema refuses {len(refused)} of {n} bodies: " + "; ".join(refused[:3]),
                 required=bool(refused), fits=not refused)

    async def _served_model(self) -> None:
        """Whether the engine serves the model the fixtures and the restore's preflight name, read from
        `GET /v1/models` (nothing is generated): a model it does not serve fails every request and
        leaves the primary out of rotation after the restore."""
        model = await self.t.preflight_model() if self.t.fixtures else None
        try:
            served = await self.call("serving", self.t.served_models())
        except ActionFailed as exc:
            self.add("serving.model", NOT_OBSERVABLE, exc.detail)
            return
        if served is None:
            self.add("serving.model", NOT_OBSERVABLE, "no GET /v1/models: whether the engine serves "
                     + (f"{model!r}" if model else "the fixtures' model") + " is found only by the first request")
        elif model is None:
            self.add("serving.model", OBSERVABLE, f"serves {', '.join(map(repr, served)) or 'no model'}")
        else:
            # an engine that refuses a name it does not serve fails every request; elsewhere a differing
            # name is said, not refused (hosts/profile_rules.py)
            strict = refuses_unserved_model(self.t.p)
            fits = model in served or not strict
            self.add("serving.model", OBSERVABLE, f"serves {', '.join(map(repr, served)) or 'no model'}"
                     + ("" if model in served else f"; the fixtures and the preflight name {model!r}"
                        + (": every request would be refused" if strict else ", which this engine does not check")),
                     required=strict, fits=fits)

    def _usage_asked(self) -> None:
        """Whether every body asks for the usage this engine streams only when asked (profile_rules.usage_unasked):
        a window reads each answer's token counts from it, so a body that does not ask fails every request."""
        if not self.t.fixtures:
            return
        unasked = usage_unasked(self.t.p, self.t.fixtures)
        self.add("serving.usage", OBSERVABLE, "every body asks for usage in its stream" if unasked is None else
                 usage_unasked_words(unasked), required=unasked is not None, fits=unasked is None)

    def _cached_tokens_reported(self) -> None:
        """Whether the engine's own recipes have it report each answer's cached_tokens (profile_rules.cached_tokens_unreported):
        without them no request's reuse is held to the counters, and a consistency phase cannot tell reuse."""
        said = cached_tokens_unreported(self.t.p)
        if said is None:
            return
        flag, lacking = said
        self.add("serving.cached_tokens", NOT_OBSERVABLE if lacking else OBSERVABLE,
                 f"each answer's usage carries cached_tokens ({flag})" if not lacking else
                 f"recipe{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} run{'' if len(lacking) > 1 else 's'} "
                 f"without {flag}: their answers carry no cached_tokens, so no request's reuse is held to the "
                 f"engine's counters and a consistency phase cannot tell reuse")

    def _field(self, name: str, ident: dict, f: str, expected: dict) -> None:
        if f not in ident:
            self.add(name, NOT_OBSERVABLE, "not in the identity reply", required=f in expected)
            return
        fits = f not in expected or ident[f] == expected[f]
        why = _shown(ident[f]) + ("" if f not in expected else (", as the plan expects" if fits else
                                                                 f"; the plan expects {_shown(expected[f])}"))
        self.add(name, OBSERVABLE, why, required=f in expected, fits=fits)

    async def metrics(self) -> None:
        try:
            m = await self.call("serving", self.t.scrape_metrics({}))
        except ActionFailed as exc:
            self.add("metrics", NOT_OBSERVABLE, exc.detail, required=True)
            return
        counters, gauges, labels = m["counters"], m["gauges"], m["labels"]
        replay = self.plan is None or any(p.kind != "identity" for p in self.plan.phases)
        no_tier = self.t.host_tier() is False
        # the verdict cannot be reached without the reuse of the tier its order probe reads
        tier = self.plan.verdict.tier if self.plan else "host"
        for c in COUNTERS:
            have = counters.get(c) is not None or any(k.startswith(f"{c}.") for k in counters)
            required = replay and c == ("host_reused_tokens" if tier == "host" else "gpu_reused_tokens")
            if no_tier and c.startswith("host_"):
                # a plan whose verdict reads the host tier cannot be decided here (`fits` false)
                needed = required and c == "host_reused_tokens"
                self.add(f"counter.{c}", NOT_APPLICABLE, "the engine's recipes configure no host tier (no KV connector, "
                         "no host-RAM cache): nothing to reuse from" + ("; the plan's verdict reads the host tier: "
                         "set [verdict] tier = \"gpu_prefix\"" if needed else ""), required=needed, fits=not needed)
                continue
            self.add(f"counter.{c}", OBSERVABLE if have else NOT_OBSERVABLE,
                     "exposed" if have else "this engine does not expose it; reported as not observable", required)
        # The seed's drain rule reads every one of these gauges; one the host does not expose is never
        # taken for zero: the plan must accept a weaker drain by name (drain.accept_unobserved).
        accepted = set(self.plan.drain.accept_unobserved) if self.plan else set()
        for g in DRAIN_GAUGES:
            have = gauges.get(g) is not None
            self.add(f"drain.{g}", OBSERVABLE if have else NOT_OBSERVABLE,
                     f"now {_num(gauges[g])}" if have else
                     ("not exposed; the plan accepts a drain judged without it (drain.accept_unobserved), and every "
                      "cell names it" if g in accepted else
                      "not exposed: the seed's drain rule cannot be held here; a plan may accept a weaker drain "
                      "with drain.accept_unobserved"), required=g not in accepted)
        for g in OCCUPANCY:
            have = gauges.get(g) is not None
            self.add(f"gauge.{g}", OBSERVABLE if have else NOT_OBSERVABLE,
                     f"now {_num(gauges[g])}" if have else "not exposed; its growth rule cannot fire")
        self.add("metrics.identity_labels", OBSERVABLE if labels else NOT_OBSERVABLE,
                 "build and incarnation info exposed" if labels else "no build/incarnation info: drift is checked "
                                                                    "through the identity endpoint only")

    # --- manager --------------------------------------------------------------------------

    async def manager(self) -> None:
        t = self.t
        try:
            st = await self.call("manager", t.manager_state({}))
        except ActionFailed as exc:
            self.add("manager.state", NOT_OBSERVABLE, exc.detail, required=True)
            return
        loaded = st.get("loaded")
        said = f"{loaded['recipe']} loaded" if loaded else "no recipe loaded: there is no incumbent to restore"
        busy = bool(st.get("busy"))
        if busy:  # a window refuses such a host at preflight (policies/takedown.py)
            said += "; a load or unload is in progress (busy): a window would refuse to start until it ends"
        self.add("manager.state", OBSERVABLE if loaded else NOT_OBSERVABLE, said, required=True, fits=not busy)
        roles = [("candidate", t.site.candidate_recipe, None)]
        if loaded:
            roles.insert(0, ("incumbent", loaded.get("recipe"), loaded.get("sha256")))
        shas = {}
        for role, name, expect in roles:
            try:
                r = await self.call("manager", t.retain_recipe({"recipe": name, "expect_sha256": expect, "keep": False}))
                shas[role] = r["sha256"]
                self.add(f"recipe.{role}", OBSERVABLE, f"{name}: {r['bytes']:,} bytes, sha256 {r['sha256'][:12]} verified",
                         required=True)
            except ActionFailed as exc:
                self.add(f"recipe.{role}", NOT_OBSERVABLE, exc.detail, required=True)
        previews = []
        if "incumbent" in shas:
            previews += [("preview.unload_incumbent", "unload", loaded["recipe"], shas["incumbent"]),
                         ("preview.rollback", "load", loaded["recipe"], shas["incumbent"])]
        if "candidate" in shas:
            previews.append(("preview.load_candidate", "load", t.site.candidate_recipe, shas["candidate"]))
        for name, op, recipe, sha in previews:
            try:
                r = await self.call("manager", t.preview({"op": op, "recipe": recipe, "sha256": sha}))
                ok = r.get("ok") is True
                self.add(name, OBSERVABLE, f"{op} {recipe}: " + ("; ".join(map(str, r.get("steps") or [])) or "no steps")
                         if ok else f"{op} {recipe}: the manager answered ok={r.get('ok')!r}", required=True, fits=ok)
            except ActionFailed as exc:
                self.add(name, NOT_OBSERVABLE, exc.detail, required=True)

    # --- router, monitoring, GPU -------------------------------------------------------------

    async def router(self) -> None:
        if not self.t.host.router.present:
            self.add("router.backend", NOT_APPLICABLE, "the site has no router: quiesce, readmission and the routed "
                                                       "preflight are not applicable")
            return
        try:
            r = await self.call("router", self.t.snapshot({"what": "router"}))
            b = r["backend"]
            n = b.get("inflight")
            counted = isinstance(n, int) and not isinstance(n, bool) and n >= 0
            # inflight is the router's routed requests in flight (docs/host-api.md): a count, never absent
            self.add("router.backend", OBSERVABLE, f"{b.get('id')}: admitted={b.get('admitted')}, inflight={n}"
                     + ("" if counted else "; inflight must be a count of routed requests (an integer >= 0): "
                        "containment cannot be judged"), required=True, fits=counted)
        except ActionFailed as exc:
            self.add("router.backend", NOT_OBSERVABLE, exc.detail, required=True)

    async def monitoring(self) -> None:
        if not self.t.host.monitoring.present:
            self.add("monitoring.target", NOT_APPLICABLE, "the site has no monitoring")
            return
        try:
            m = await self.call("monitoring", self.t.snapshot({"what": "monitoring"}))
            tgt = m.get("target")
            self.add("monitoring.target", OBSERVABLE if tgt else NOT_OBSERVABLE,
                     f"{tgt.get('id')}: registered={tgt.get('registered')}, healthy={tgt.get('healthy')}" if tgt
                     else f"no target {self.t.host.monitoring.target!r}", required=True)
        except ActionFailed as exc:
            self.add("monitoring.target", NOT_OBSERVABLE, exc.detail, required=True)

    async def gpu(self) -> None:
        g = self.t.host.gpu
        production = self.plan is not None and self.plan.production
        if not self.t.host.gpu.present:
            self.add("gpu.watch", NOT_OBSERVABLE if production else NOT_APPLICABLE,
                     "gpu.source = \"none\": Xid, OOM and GPU memory rules cannot be enforced", required=production)
            return
        from flare_diag.daemon.hosts.nvml import NvmlUnavailable
        try:
            v = await self.call("gpu", self.t.gpu_view())
        except ActionFailed as exc:
            self.add("gpu.watch", NOT_OBSERVABLE, exc.detail, required=production)
            return
        except NvmlUnavailable as exc:  # a machine without the NVIDIA driver: said, not a traceback
            self.add("gpu.watch", NOT_OBSERVABLE, f"{exc}: the Xid, OOM and GPU memory rules cannot be enforced",
                     required=production)
            return
        gpus = v.get("gpus") or []
        mem = all(x.get("memory_total_bytes") for x in gpus) and bool(gpus)
        self.add("gpu.watch", OBSERVABLE, f"{len(gpus)} GPUs via {g.source}; Xid events "
                 + ("readable" if "xid_events" in v and not v.get("xid_watch_error") else
                    f"NOT readable ({v.get('xid_watch_error', 'no xid_events')})"), required=production,
                 fits="xid_events" in v and not v.get("xid_watch_error"))
        self.add("gpu.memory", OBSERVABLE if mem else NOT_OBSERVABLE,
                 "used and total memory read" if mem else "GPU memory not reported: the memory rule cannot fire")


    async def steady_state(self) -> None:
        """Every guard of the plan: each series its query reads known to the site's Prometheus or not,
        and its value now; a guard (not a dry run) already breached means a pool already unhealthy,
        which no window may take a primary out of."""
        guards = self.plan.guards if self.plan is not None else []
        if not guards:
            return
        prom = self.t.prometheus
        if prom is None:
            for g in guards:
                self.add(f"guard.{g.name}", NOT_OBSERVABLE, "the site has no [steady_state] prometheus_url to evaluate "
                         "it on", required=not g.dry_run)
            return
        for g in guards:
            for sel in steady.selectors(g.query):
                try:
                    n = await prom.series(sel)
                except ActionFailed as exc:
                    self.add(f"guard.{g.name}.series {sel}", NOT_OBSERVABLE, exc.detail, required=not g.dry_run)
                    continue
                self.add(f"guard.{g.name}.series {sel}", OBSERVABLE if n else NOT_OBSERVABLE,
                         f"{n} series in Prometheus" if n else f"Prometheus at {prom.url} knows no such series",
                         required=not g.dry_run)
            try:
                r = await prom.query(g.query)
            except ActionFailed as exc:
                self.add(f"guard.{g.name}", NOT_OBSERVABLE, exc.detail, required=not g.dry_run)
                continue
            value = steady.worst(g, r["values"])
            if value is None:
                self.add(f"guard.{g.name}", NOT_OBSERVABLE, f"the query answered no number ({r['series']} series)",
                         required=not g.dry_run)
                continue
            bad = steady.breached(g, value)
            self.add(f"guard.{g.name}", OBSERVABLE,
                     f"{value:.6g} now; breaches when {g.breach_if} {g.threshold:g}"
                     + (" (dry run: logged, never aborts)" if g.dry_run else "")
                     + (": BREACHED: the pool is already unhealthy; nothing may be taken out of it" if bad and not g.dry_run
                        else ": breached now" if bad else ""),
                     required=not g.dry_run, fits=not bad)


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _shown(v: object) -> str:
    """An identity value as the reply gave it; a count grouped (34,359,738,368 bytes reads at a glance)."""
    return f"{v:,}" if type(v) is int else repr(v)


async def check_site(target: Target, plan: Plan | None) -> SiteCheck:
    """Probes `target`'s site for `plan` (or for the contract alone), changing nothing on it."""
    return await _Probe(target, plan).run()


def render(check: SiteCheck) -> str:
    lines = [f"site check of {check.site}" + (f" for plan {check.plan}" if check.plan else " (no plan: contract only)")]
    for line in check.services.values():
        lines.append(f"SERVICE DOWN    {line}")
    for c in check.capabilities:
        mark = "  <- required" if c.missing else ""
        lines.append(f"{c.status:15} {c.name:34} {c.reason}{mark}")
    lines.append(check.summary())
    return "\n".join(lines)


async def checked_target(setup: WindowSetup, recipe_dir: Path) -> Target:
    """The window's target, once `site check` found everything the plan needs; else InputError
    (nothing on the host was changed)."""
    short = disk_short(recipe_dir.parent, setup)  # the log's folder: before a byte is asked of the host
    if short:
        raise InputError(short)
    target = Target(setup.site, setup.fixtures, setup.plan_sha256, recipe_dir=recipe_dir)
    try:
        check = await check_site(target, setup.plan)
    except BaseException:
        await target.close()
        raise
    if not check.ready:
        await target.close()
        raise InputError(check.summary() + f"; see `flare-diag site check {setup.site_profile or 'SITE'} --plan PLAN`")
    try:
        breaches = await incumbent_breaches(target, setup.plan)
    except BaseException:
        await target.close()
        raise
    if breaches:
        await target.close()
        raise InputError(scrub(f"{setup.plan_path or 'plan'}: the incumbent as it serves now already breaches "
                               f"{'; '.join(breaches)}; a window would abort and strand the primary, so nothing was "
                               f"changed", setup.site.tokens.values()))  # the breaches quote the host's answers
    return target


LOG_BYTES_PER_REQUEST = 16 << 10  # a request's events (request_done with its head, measured, actions, watches)
LOG_BYTES_BASE = 32 << 20         # the window's other events, its checkpoint, the WAL's slack, the reports


def log_bytes_needed(setup: WindowSetup) -> int:
    """A generous bound on what the window's log and reports take: about 4 KB an event was measured
    (a rehearsal's 261 events in about 1 MiB), a request writes three or four."""
    from flare_diag.policies.planner import phase_requests
    n = sum(len(phase_requests(ph, len(setup.fixtures[ph.fixture].bodies))) for ph in setup.plan.phases
            if ph.fixture in setup.fixtures)
    return LOG_BYTES_BASE + n * LOG_BYTES_PER_REQUEST


def disk_short(folder: Path, setup: WindowSetup) -> str | None:
    """Why the log's file system cannot take the window's log (a full disk mid-window sends it to its
    restore, the log's tail kept only in memory), or None."""
    import os
    probe = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if probe is None:
        return None
    try:
        st = os.statvfs(probe)
    except OSError:
        return None  # nothing to measure it by: the window's own store failure path still stands
    free, need = st.f_bavail * st.f_frsize, log_bytes_needed(setup)
    if free >= need:
        return None
    return (f"{folder}: its file system has {free / 2**20:,.1f} MiB free; this window's log and reports need about "
            f"{need / 2**20:,.0f} MiB; free some, or put the log elsewhere (--out, or the daemon's --state-dir)")


async def incumbent_breaches(target: Target, plan: Plan) -> list[str]:
    """The plan's growth bounds the incumbent breaches before anything changes (reads only)."""
    try:
        gpu = await target.snapshot({"what": "gpu"})
    except (ActionFailed, httpx.HTTPError):  # no GPU view here: site check said whether the plan can go without one
        gpu = {}
    try:
        m = await target.scrape_metrics({})
    except (ActionFailed, httpx.HTTPError):
        m = {}
    return guards.incumbent_breaches(m.get("gauges") or {}, gpu.get("gpus") or [], plan.growth)
