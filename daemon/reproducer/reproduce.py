"""`flare-diag reproduce`: a window's exact request sequence, or a block-level trace, through the
host-cache model (the seed's CPU reproducer); agreement with what the window observed, and the
cache's eviction policies side by side on the same requests. Descriptive: no speedup is projected
onto hardware."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.fixture import FixtureError, find_fixture, load_fixture
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import ActionDone, ActionRequested, RequestDone, RequestMeasured, VerdictReached, WindowOpened
from flare_diag.daemon.simulator import MOONCAKE_BLOCK, BlockLRU, Incarnation, Scenario, read_trace, run_block_lru, run_host_cache

# every strategy the model knows (the scenario's `eviction`), so a strategy added there is offered here too
POLICIES: tuple[str, ...] = typing.get_args(typing.get_type_hints(Scenario)["eviction"])
BASELINE = "block_lru"  # pages only, plain LRU over blocks: what a GPU prefix cache does
MAX_DIVERGENCES_SHOWN = 20


class ReproduceError(ValueError):
    """The log or trace cannot be reproduced as asked (one line)."""


class Sent(msgspec.Struct, frozen=True):
    phase: str
    order_index: int
    body_sha256: str
    observed: int | None  # the window's per-request host reused tokens; None where it was not observed
    prompt_tokens: int | None = None  # the prompt tokens the host reported for it
    gpu_observed: int | None = None  # its GPU prefix-cache reused tokens; None where not observed
    completion_tokens: int | None = None  # the tokens the engine generated for it


class Segment(msgspec.Struct):
    incarnation: str
    requests: list[Sent] = []


class Divergence(msgspec.Struct, frozen=True):
    phase: str
    order_index: int
    body_sha256: str
    predicted: int
    observed: int


class PolicyResult(msgspec.Struct):
    policy: str
    reused_tokens: int = 0
    stores: dict[str, int] = {}
    evictions: dict[str, int] = {}
    compactions: int = 0
    rows_used_peak: int = 0
    rows_capacity: int | None = None
    pages_used_peak: int = 0
    pages_capacity: int | None = None


class Reproduction(msgspec.Struct):
    window_id: str
    scenario: str
    rows_capacity: int
    pages_capacity: int
    geometry_source: str
    incarnations: int
    replayed: int
    compared: int
    agreed: int
    tolerance: int
    predicted_total: int
    observed_total: int
    divergences: list[Divergence]
    policies: list[PolicyResult]
    note: str = ("descriptive: the model's counts on the window's own requests, the input to a follow-on "
                 "policy window, not a projection of speed on hardware")
    hint: str = ""  # what the window's own verdict says about reading the agreement

    @property
    def reproduces(self) -> bool:
        return self.compared > 0 and self.agreed == self.compared


def choose_window(r: LogReader, db: Path, window_id: str | None) -> str:
    """The window asked for, or the log's last; ReproduceError naming the log's windows otherwise."""
    ids = r.window_ids()
    if not ids:
        raise ReproduceError(f"{db}: no window in this log")
    wid = window_id or ids[-1]
    if wid not in ids:
        raise ReproduceError(f"{db}: no window {wid!r} (windows: {', '.join(ids[-5:])})")
    return wid


def window_sequence(db: Path, window_id: str | None) -> tuple[WindowOpened, list[Segment], dict, str | None]:
    """What the window sent, in order, per incarnation it loaded; the host-cache gauges it saw; and
    the hypothesis its verdict named (None: no verdict yet)."""
    with LogReader(db) as r:
        wid = choose_window(r, db, window_id)
        opened, segments, hypothesis = None, [], None
        gauges: dict[str, typing.Any] = {}  # the host-cache gauges of the first scrape that had them
        loads: dict[int, str] = {}
        scrapes: set[int] = set()
        prompts: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        identities: set[int] = set()
        block_tokens = None  # the engine's KV block size, where its identity states one (vLLM's kv_block_size)
        for env in r.iter(window_id=wid):
            ev = env.event()
            if isinstance(ev, WindowOpened):
                opened = ev
            elif isinstance(ev, VerdictReached):
                hypothesis = ev.hypothesis
            elif isinstance(ev, ActionRequested) and ev.action == "load":
                loads[ev.action_id] = str(ev.args.get("label") or ev.args.get("recipe"))
            elif isinstance(ev, ActionRequested) and ev.action == "read_identity":
                identities.add(ev.action_id)
            elif isinstance(ev, ActionDone) and ev.action_id in identities:
                bt = (ev.data or {}).get("kv_block_size") if ev.ok and isinstance(ev.data, dict) else None
                block_tokens = int(bt) if isinstance(bt, (int, str)) and str(bt).isdigit() else block_tokens
            elif isinstance(ev, ActionRequested) and ev.action == "scrape_metrics" and not gauges:
                scrapes.add(ev.action_id)
            elif isinstance(ev, ActionDone) and ev.action_id in loads:
                label = loads.pop(ev.action_id)
                if ev.ok:
                    segments.append(Segment(label, []))
            elif isinstance(ev, ActionDone) and ev.action_id in scrapes:
                g = (ev.data or {}).get("gauges") or {} if ev.ok else {}
                if g.get("rows_capacity") is not None or g.get("pages_capacity") is not None:
                    gauges = {k: g.get(k) for k in ("rows_capacity", "pages_capacity")}
                    scrapes.clear()
            elif isinstance(ev, RequestDone):
                prompts[(ev.phase, ev.order_index)] = (ev.prompt_tokens, ev.completion_tokens)
            elif isinstance(ev, RequestMeasured) and ev.outcome == "ok" and segments:
                obs, gpu = ((ev.delta or {}).get(k) for k in ("host_reused_tokens", "gpu_reused_tokens"))
                prompt, completion = prompts.pop((ev.phase, ev.order_index), (None, None))
                segments[-1].requests.append(Sent(ev.phase, ev.order_index, ev.body_sha256,
                                                  None if obs is None else int(obs), prompt,
                                                  None if gpu is None else int(gpu), completion))
    if opened is None:
        raise ReproduceError(f"{db}: window {wid!r} has no window_opened event")
    return opened, segments, {**gauges, **({"block_tokens": block_tokens} if block_tokens else {})}, hypothesis


def _bodies(opened: WindowOpened) -> dict[str, bytes]:
    """The fixtures' bodies by sha256, found where the window found them (or built in)."""
    dirs = [Path(d) for d in opened.fixture_dirs]
    out: dict[str, bytes] = {}
    for f in opened.plan.get("fixtures") or []:
        name = f.get("name") if isinstance(f, dict) else None
        if not name:
            continue
        try:
            fx = load_fixture(find_fixture(name, dirs))
        except FixtureError as exc:
            raise ReproduceError(str(exc)) from None  # it names the fixture and where it was looked for
        out.update(zip(fx.sha256, fx.bodies))
    return out


def _replay(segments: list[Segment], bodies: dict[str, bytes], sc: Scenario, rows: int, pages: int
            ) -> tuple[list[int], PolicyResult]:
    """Every request through fresh model incarnations, as the window loaded them: the host reuse the
    model predicts for each, and the cache's counters summed over the incarnations."""
    predicted: list[int] = []
    res = PolicyResult(sc.eviction, rows_capacity=rows, pages_capacity=pages, stores={}, evictions={})
    for seg in segments:
        inc = Incarnation(sc, seg.incarnation, seg.incarnation, "-", rows_capacity=rows, pages_capacity=pages)
        for s in seg.requests:
            body = bodies[s.body_sha256]
            p = inc.run_inline(body, json.loads(body))
            predicted.append(p.lookup.reused)
            res.rows_used_peak = max(res.rows_used_peak, inc.cache.rows_used)
            res.pages_used_peak = max(res.pages_used_peak, inc.cache.pages_used)
        c = inc.cache.c
        res.reused_tokens += c.reused_tokens
        for k, v in c.stores.items():
            res.stores[k] = res.stores.get(k, 0) + v
        for k, v in c.evictions.items():
            res.evictions[k] = res.evictions.get(k, 0) + v
        res.compactions += c.compactions
    return predicted, res


def _block_baseline(segments: list[Segment], bodies: dict[str, bytes], sc: Scenario, pages: int) -> PolicyResult:
    """The block-level baseline on the window's requests: each incarnation's prompt blocks in one LRU list."""
    from flare_diag.daemon.simulator import TokenSeq, render_prompt
    res = PolicyResult(BASELINE, pages_capacity=pages)
    for seg in segments:
        cache = BlockLRU(pages)  # a fresh incarnation's cache is empty
        for s in seg.requests:
            tokens, _prefix = render_prompt(json.loads(bodies[s.body_sha256]).get("messages") or [])
            res.reused_tokens += cache.request(TokenSeq(tokens, sc.block_tokens).chain) * sc.block_tokens
            res.pages_used_peak = max(res.pages_used_peak, len(cache.lru))
    return res


def reproduce_window(db: Path, window_id: str | None, sc: Scenario, policies: list[str], tolerance: int = 0
                     ) -> Reproduction:
    opened, segments, gauges, hypothesis = window_sequence(db, window_id)
    bodies = _bodies(opened)
    missing = {s.body_sha256 for seg in segments for s in seg.requests} - set(bodies)
    if missing:
        raise ReproduceError(f"{len(missing)} body hash(es) the window sent are in none of its fixtures "
                             f"(first {sorted(missing)[0][:12]})")
    rows = gauges.get("rows_capacity")
    pages = gauges.get("pages_capacity")
    source = "the window's gauges"
    if rows is None or pages is None:  # an engine that does not expose its pools: the scenario's
        rows, pages, source = rows or sc.rows_capacity, pages or sc.pages_capacity, f"scenario {sc.name} (the window's engine exposes no pool gauges)"
    rows, pages = int(rows), int(pages)
    predicted, own = _replay(segments, bodies, sc, rows, pages)
    sent = [s for seg in segments for s in seg.requests]
    divergences, compared, agreed, obs_total, pred_total = [], 0, 0, 0, 0
    for s, p in zip(sent, predicted):
        if s.observed is None:
            continue
        compared += 1
        obs_total += s.observed
        pred_total += p
        if abs(p - s.observed) <= tolerance:
            agreed += 1
        else:
            divergences.append(Divergence(s.phase, s.order_index, s.body_sha256, p, s.observed))
    results = []
    for pol in policies:
        if pol == BASELINE:
            results.append(_block_baseline(segments, bodies, sc, pages))
        elif pol == sc.eviction:
            results.append(own)
        else:
            results.append(_replay(segments, bodies, msgspec.structs.replace(sc, eviction=pol), rows, pages)[1])
    hint = ""
    if hypothesis == "restore_path":
        hint = (f"the window's verdict is restore_path: its lookups found checkpoints that no restore completed. "
                f"A model agrees only if it restores nothing either (scenario restore_completes = false, e.g. "
                f"--scenario restore-stalled); scenario {sc.name} "
                + ("does" if not sc.restore_completes else "restores what it finds, so its reuse is what the same "
                   "hits would give through a working restore path"))
    return Reproduction(opened.window_id, sc.name, rows, pages, source, len(segments), len(sent), compared, agreed,
                        tolerance, pred_total, obs_total, divergences, results, hint=hint)


class TraceResult(msgspec.Struct):
    capacity_blocks: int
    capacity_rows: int
    policy: str
    reused_tokens: int
    reused_share: float
    stores: dict[str, int] = {}
    evictions: dict[str, int] = {}
    compactions: int = 0
    rows_used_peak: int = 0
    pages_used_peak: int = 0


class TraceReproduction(msgspec.Struct):
    trace: str
    requests: int
    input_tokens: int
    block_tokens: int
    scenario: str
    results: list[TraceResult]
    note: str = "descriptive: the model's reuse on this trace's requests at each capacity, not a speedup on hardware"


def rows_for(sc: Scenario, capacity_blocks: int) -> int:
    """Continuation rows in the scenario's proportion to pages (Flare 47581cca: 52 rows to 5,720 pages)."""
    return max(1, round(capacity_blocks * sc.rows_capacity / sc.pages_capacity))


def reproduce_trace(path: Path, capacities: list[int], sc: Scenario, policies: list[str], rows: int | None = None,
                    limit: int | None = None, block: int = MOONCAKE_BLOCK) -> TraceReproduction:
    results: list[TraceResult] = []
    total = None
    for cap in capacities:
        r_cap = rows if rows is not None else rows_for(sc, cap)
        for pol in policies:
            if pol == BASELINE:
                st = run_block_lru(read_trace(path, limit), cap, block)
                results.append(TraceResult(cap, 0, pol, st.reused_tokens, st.reused_tokens / max(st.input_tokens, 1),
                                           pages_used_peak=st.pages_used_peak))
            else:
                cache, st = run_host_cache(read_trace(path, limit), msgspec.structs.replace(sc, eviction=pol),
                                           r_cap, cap, block)
                c = cache.c
                results.append(TraceResult(cap, r_cap, pol, st.reused_tokens, st.reused_tokens / max(st.input_tokens, 1),
                                           dict(c.stores), dict(c.evictions), c.compactions, st.rows_used_peak,
                                           st.pages_used_peak))
            total = total or (st.requests, st.input_tokens)
    n, tokens = total or (0, 0)
    return TraceReproduction(str(path), n, tokens, block, sc.name, results)


def parse_policies(spec: str | None, default: list[str]) -> list[str]:
    if not spec:
        return default
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in names if p not in (*POLICIES, BASELINE)]
    if bad or not names:
        raise ReproduceError(f"--policies {spec!r}: expected a comma-separated list of {', '.join((*POLICIES, BASELINE))}")
    return names


def agreement_line(rep: Reproduction) -> str:
    if rep.compared == 0:
        return "NOT REPRODUCED: the window observed no per-request host reuse to compare with"
    pct = 100 * rep.agreed / rep.compared
    verdict = "reproduces the window" if rep.reproduces else "DOES NOT reproduce the window"
    return (f"agreement: {rep.agreed:,}/{rep.compared:,} requests within {rep.tolerance:,} tokens ({pct:.1f}%); "
            f"host reused tokens predicted {rep.predicted_total:,}, observed {rep.observed_total:,}: the model {verdict}")


def render_window(rep: Reproduction) -> list[str]:
    out = [f"window {rep.window_id}: scenario {rep.scenario}, rows {rep.rows_capacity:,} and pages {rep.pages_capacity:,} "
           f"from {rep.geometry_source}",
           f"replayed {rep.replayed:,} requests on {rep.incarnations} fresh incarnation(s); {rep.compared:,} carry the window's "
           f"own per-request host reuse", agreement_line(rep)] + ([f"note: {rep.hint}"] if rep.hint else [])
    for d in rep.divergences[:MAX_DIVERGENCES_SHOWN]:
        out.append(f"  diverges: {d.phase} #{d.order_index} (body {d.body_sha256[:12]}): predicted {d.predicted:,}, "
                   f"observed {d.observed:,}")
    if len(rep.divergences) > MAX_DIVERGENCES_SHOWN:
        out.append(f"  ... and {len(rep.divergences) - MAX_DIVERGENCES_SHOWN} more (--json lists them all)")
    if rep.policies:
        out.append("")
        out.append(f"policies on the same requests ({rep.note}):")
        out += _policy_table(rep.policies)
    return out


_POLICY_HEAD = ["policy", "reused (tokens)", "stores message_prefix/full_prompt/terminal", "evictions row/page",
                "compactions", "rows used peak / capacity", "pages used peak / capacity"]


def _policy_row(p: PolicyResult) -> list[str]:
    st = "/".join(f"{p.stores.get(k, 0):,}" for k in ("message_prefix", "full_prompt", "terminal")) if p.stores else "n/a"
    ev = f"{p.evictions.get('row', 0):,}/{p.evictions.get('page', 0):,}" if p.evictions else "n/a"
    return [p.policy, f"{p.reused_tokens:,}", st, ev, f"{p.compactions:,}" if p.policy != BASELINE else "n/a",
            f"{p.rows_used_peak:,} / {p.rows_capacity:,}" if p.rows_capacity else "n/a",
            f"{p.pages_used_peak:,} / {p.pages_capacity:,}" if p.pages_capacity is not None else "n/a"]


def _policy_table(results: list[PolicyResult]) -> list[str]:
    return _table(_POLICY_HEAD, [_policy_row(p) for p in results])


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [line(head), *(line(r) for r in rows)]


def render_trace(rep: TraceReproduction) -> list[str]:
    out = [f"trace {rep.trace}: {rep.requests:,} requests, {rep.input_tokens:,} prompt tokens, blocks of {rep.block_tokens:,} "
           f"tokens; scenario {rep.scenario} ({rep.note})"]
    caps = sorted({r.capacity_blocks for r in rep.results})
    pols = list(dict.fromkeys(r.policy for r in rep.results))
    rows = []
    for cap in caps:
        by = {r.policy: r for r in rep.results if r.capacity_blocks == cap}
        r_rows = next((r.capacity_rows for r in by.values() if r.capacity_rows), 0)
        rows.append([f"{cap:,}", f"{r_rows:,}"] + [f"{by[p].reused_tokens:,} ({100 * by[p].reused_share:.1f}%)" for p in pols])
    out += _table(["capacity (blocks)", "rows"] + [f"{p} reused (tokens)" for p in pols], rows)
    return out


def render_html(rep: Reproduction) -> str:
    """The policies side by side as a self-contained page (two charts and the table)."""
    from html import escape

    from flare_diag.daemon.reports import charts
    reused = charts.hbars_grid("Host reused tokens per policy, on the window's own requests",
                               [("reused tokens", [(p.policy, float(p.reused_tokens), charts.fmt(p.reused_tokens))
                                                   for p in rep.policies])], "host reused (tokens)", per_row=1)
    cached = [p for p in rep.policies if p.policy != BASELINE]  # the baseline has no rows and counts no evictions
    churn = charts.hbars_grid("Row evictions, page evictions and compactions per policy",
                              [(what, [(p.policy, float(v), charts.fmt(v)) for p in cached
                                       for v in [(p.evictions.get(k, 0) if k else p.compactions)]])
                               for what, k in (("row evictions", "row"), ("page evictions", "page"), ("compactions", None))],
                              "count (events)", per_row=3)
    head, rows = _POLICY_HEAD, [_policy_row(p) for p in rep.policies]
    table = ("<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
             + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</tbody></table>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>reproduce "
            f"{escape(rep.window_id)}</title><style>body{{font:14px system-ui,sans-serif;margin:1em auto;max-width:70em}}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th{text-align:left}"
            "table{border-collapse:collapse}</style></head><body>"
            f"<h1>Reproducer: window {escape(rep.window_id)}</h1><p>{escape(agreement_line(rep))}</p>"
            f"<p>{escape(rep.note)}</p><figure id=chart-reused>{reused}</figure><figure id=chart-churn>{churn}</figure>"
            f"{table}</body></html>\n")


def render_trace_html(rep: TraceReproduction) -> str:
    """Reuse against capacity, one line per policy, and the table, as a self-contained page."""
    from html import escape

    from flare_diag.daemon.reports import charts
    pols = list(dict.fromkeys(r.policy for r in rep.results))
    series = [(p, [(float(r.capacity_blocks), 100 * r.reused_share) for r in rep.results if r.policy == p]) for p in pols]
    chart = charts.lines("Prompt tokens reused, by policy and capacity", series, "capacity (blocks)",
                         "reused (% of prompt tokens)")
    rows = "".join(f"<tr><td>{escape(r.policy)}</td><td>{r.capacity_blocks:,}</td><td>{f'{r.capacity_rows:,}' if r.capacity_rows else 'n/a'}</td>"
                   f"<td>{r.reused_tokens:,}</td><td>{100 * r.reused_share:.2f}</td></tr>" for r in rep.results)
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>reproduce trace</title><style>"
            "body{font:14px system-ui,sans-serif;margin:1em auto;max-width:70em}td,th{border:1px solid #ccc;"
            "padding:3px 6px}table{border-collapse:collapse}</style></head><body>"
            f"<h1>Reproducer: {escape(Path(rep.trace).name)}</h1><p>{escape(render_trace(rep)[0])}</p>"
            f"<figure id=chart-capacity>{chart}</figure><table><thead><tr><th>policy</th><th>capacity (blocks)</th>"
            f"<th>rows</th><th>reused (tokens)</th><th>reused (% of prompt tokens)</th></tr></thead><tbody>{rows}"
            "</tbody></table></body></html>\n")
