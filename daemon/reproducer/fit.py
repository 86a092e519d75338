"""`flare-diag reproduce LOG --fit`: which host-cache model, of which capacity, explains a window best.

A family is a cache the host could have, with one free capacity; each is fitted to the window's own
requests (their order, their incarnations, the tokens the host reported for each body) by trying
capacities and counting the requests whose predicted host reuse equals the observed one:

- `lru_records`: a plain LRU over whole-prompt records of N entries; a hit reuses the prompt the host
  reported for that body (what the contract host keeps).
- `seed_pools`: the seed's row and page pools with leaf-first eviction (flaresim's model), N rows and
  the scenario's pages per row.
- `block_lru`: an LRU over N prompt blocks, as a GPU prefix cache keeps them.
- `gpu_then_records`: a records LRU of N entries behind a GPU tier of G whole prompts (both fitted): a
  prompt still on the GPU is not asked of the host tier, so the host reuses nothing for it; every real
  engine has this shape, a GPU prefix cache in front of its host tier.

A window with no host reuse observed but GPU prefix-cache reuse per request (a vLLM with no KV
connector) is fitted on its prefix cache instead (`fit_prefix_cache`): `vllm_blocks`, vLLM's block pool
of N blocks, against the plain `block_lru` of the same blocks.

The best fit (most requests agreeing; at equal agreement the simpler family, then the smaller N) is
reported with the runners-up. A capacity at the top of what the window can tell apart (every body fits)
is a lower bound, and said so. The policy comparison then runs on the fitted model.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Set
from pathlib import Path

import msgspec

from flare_diag.daemon.reproducer.reproduce import ReproduceError, Segment, _bodies, _replay, window_sequence
from flare_diag.daemon.simulator import BlockLRU, Scenario, TokenSeq, render_prompt

FAMILIES = ("lru_records", "seed_pools", "block_lru", "gpu_then_records", "vllm_blocks")
RECORD_POLICIES = ("lru", "fifo", "lfu")  # what a records cache could evict by instead, compared at the fitted N


class Fit(msgspec.Struct, frozen=True):
    family: str
    capacity: int
    agreed: int
    compared: int
    lower_bound: bool = False  # every capacity from here up explains the window equally well
    front: int = 0  # gpu_then_records: the GPU tier's whole prompts in front of the `capacity` records

    @property
    def share(self) -> float:
        return self.agreed / self.compared if self.compared else 0.0


class FitReport(msgspec.Struct):
    window_id: str
    compared: int
    best: Fit
    runners_up: list[Fit]
    policies: dict[str, int]  # eviction policy -> host tokens reused on the window's requests at the fitted capacity
    note: str = ""


def _records(segments: list[Segment], size: dict[str, int], n: int, policy: str = "lru") -> list[int]:
    out = []
    for seg in segments:  # each incarnation starts empty
        cache: OrderedDict[str, int] = OrderedDict()
        for s in seg.requests:
            k = s.body_sha256
            if k in cache:
                if policy == "lru":
                    cache.move_to_end(k)
                cache[k] += 1
                out.append(size.get(k, 0))
                continue
            out.append(0)
            if n <= 0:
                continue
            cache[k] = 1
            while len(cache) > n:
                if policy == "lfu":  # least used first; among equals the oldest
                    victim = min(cache, key=lambda key: cache[key])
                    del cache[victim]
                else:
                    cache.popitem(last=False)
    return out


def _two_tier(segments: list[Segment], size: dict[str, int], gpu: int, n: int) -> list[int]:
    """Host reuse per request with a GPU LRU of `gpu` prompts in front of a host LRU of `n` records."""
    out = []
    for seg in segments:  # each incarnation starts empty
        front: OrderedDict[str, None] = OrderedDict()
        host: OrderedDict[str, None] = OrderedDict()
        for s in seg.requests:
            k = s.body_sha256
            if k in front:
                front.move_to_end(k)
                out.append(0)
                continue
            if k in host:
                host.move_to_end(k)
                out.append(size.get(k, 0))
            else:
                out.append(0)
                host[k] = None
                while len(host) > n:
                    host.popitem(last=False)
            if gpu > 0:
                front[k] = None
                while len(front) > gpu:
                    front.popitem(last=False)
    return out


def _best_two_tier(segments: list[Segment], size: dict[str, int], distinct: int, tolerance: int) -> Fit:
    """Both capacities: a coarse grid, then every pair around its best (most agreeing; then the smaller
    host tier, then the smaller GPU tier)."""
    seen: dict[tuple[int, int], tuple[int, int]] = {}

    def score(g: int, n: int) -> tuple[int, int]:
        if (g, n) not in seen:
            seen[(g, n)] = _agreement(segments, _two_tier(segments, size, g, n), tolerance)
        return seen[(g, n)]

    def best() -> tuple[int, int]:
        return max(seen, key=lambda k: (seen[k][0], -k[1], -k[0]))

    coarse = _coarse(distinct)
    for g in coarse:
        for n in coarse:
            score(g, n)
    def near(v: int) -> range:  # every capacity between the coarse neighbours of v
        i = coarse.index(v)
        return range(coarse[max(0, i - 1)], coarse[min(len(coarse) - 1, i + 1)] + 1)

    g0, n0 = best()
    for g in near(g0):
        for n in near(n0):
            score(g, n)
    g, n = best()
    return Fit("gpu_then_records", n, seen[(g, n)][0], seen[(g, n)][1], lower_bound=n >= distinct, front=g)


def _blocks(segments: list[Segment], chains: dict[str, list[bytes]], sc: Scenario, n: int) -> list[int]:
    out: list[int] = []
    for seg in segments:
        cache = BlockLRU(n)
        for s in seg.requests:
            out.append(cache.request(chains[s.body_sha256]) * sc.block_tokens)
    return out


def _agreement(segments: list[Segment], predicted: list[int], tolerance: int, gpu: bool = False) -> tuple[int, int]:
    agreed = compared = 0
    for s, p in zip((s for seg in segments for s in seg.requests), predicted):
        obs = s.gpu_observed if gpu else s.observed
        if obs is None:
            continue
        compared += 1
        agreed += abs(p - obs) <= tolerance
    return agreed, compared


def _vllm_blocks(segments: list[Segment], block: int, n: int) -> list[int]:
    """GPU prefix reuse per request in vLLM's block pool of `n` blocks (0.32.0: vllm/v1/core/block_pool.py,
    single_type_kv_cache_manager.py). One block is the pool's null block. A request takes the cached blocks
    of its prompt's leading full blocks (never its last token's) out of the free queue and the rest from
    the queue's front (a cached block taken so is evicted). Finishing, it frees its blocks tail first: a
    full block (hashed) to the queue's back, a partial one to its front (BlockPool.free_blocks: "LIFO reuse
    of non-cached blocks"). The bodies share no leading block (the caller checks), so a body's i-th block is
    (body, i); one request at a time, as a C1 window sends."""
    out = []
    for seg in segments:  # each incarnation starts empty
        free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(max(0, n - 1)))
        cached: dict[tuple, int] = {}
        held: dict[int, tuple[object, ...]] = {}
        for s in seg.requests:
            prompt = s.prompt_tokens or 0
            kv = prompt + max(0, (s.completion_tokens or 1) - 1)  # every token but the last one generated
            chain: list[tuple[object, ...]] = [(s.body_sha256, i) for i in range(kv // block)]  # past the prompt: never matched again
            chain[prompt // block:] = [(s.body_sha256, s.order_index, s.phase, i) for i in range(prompt // block, kv // block)]
            hits = 0
            while hits < min(prompt // block, (prompt - 1) // block) and chain[hits] in cached:
                hits += 1
            blocks = [cached[k] for k in chain[:hits]]
            for b in blocks:
                free.pop(b, None)
            for i in range(min(-(-kv // block) - hits, len(free))):
                b, _ = free.popitem(last=False)
                if b in held:
                    del cached[held.pop(b)]
                if hits + i < len(chain):
                    cached[chain[hits + i]], held[b] = b, chain[hits + i]
                blocks.append(b)
            for b in reversed(blocks):
                free[b] = None
                if b not in held:
                    free.move_to_end(b, last=False)
            out.append(hits * block)
    return out


class PrefixFitError(ReproduceError):
    """The window's requests cannot be fitted on a prefix cache (said why)."""


def fit_prefix_cache(opened, segments: list[Segment], block: int, tolerance: int) -> FitReport:
    """The GPU prefix cache's capacity in blocks, from each request's GPU reuse: vLLM's block pool against
    a plain block LRU over the same blocks (most requests agreeing; then the smaller capacity)."""
    sent = [s for seg in segments for s in seg.requests]
    if any(s.prompt_tokens is None for s in sent if s.gpu_observed is not None):
        raise PrefixFitError("a request with GPU reuse has no prompt token count: its blocks cannot be told")
    for seg in segments:  # a body's first request in an incarnation finds nothing unless bodies share blocks
        seen: set[str] = set()
        for s in seg.requests:
            if s.body_sha256 not in seen and (s.gpu_observed or 0) > 0:
                raise PrefixFitError(f"body {s.body_sha256[:12]} reused {s.gpu_observed} tokens on its first request "
                                     f"in incarnation {seg.incarnation}: the bodies share blocks, which the fit "
                                     f"cannot tell without the engine's tokens")
            seen.add(s.body_sha256)
    top = sum(-(-(s.prompt_tokens or 0) // block) + 1 for s in {s.body_sha256: s for s in sent}.values()) + 1

    def best_of(family: str, predict) -> Fit:
        seen: dict[int, tuple[int, int]] = {}
        for n in range(0, top + 1):
            seen[n] = _agreement(segments, predict(n), tolerance, gpu=True)
        n = max(seen, key=lambda k: (seen[k][0], -k))
        return Fit(family, n, seen[n][0], seen[n][1], lower_bound=n >= top)

    def lru(n: int) -> list[int]:
        out = []
        for seg in segments:
            cache = BlockLRU(n)
            for s in seg.requests:
                chain = [(s.body_sha256, i) for i in range(min((s.prompt_tokens or 0) // block,
                                                                ((s.prompt_tokens or 1) - 1) // block))]
                out.append(cache.request(chain) * block)
        return out

    fits = sorted([best_of("vllm_blocks", lambda n: _vllm_blocks(segments, block, n)), best_of("block_lru", lru)],
                  key=lambda f: (-f.agreed, FAMILIES.index(f.family), f.capacity))
    return FitReport(opened.window_id, fits[0].compared, fits[0], fits[1:], {},
                     f"the GPU prefix cache, fitted from each request's GPU reuse in blocks of {block} tokens")


def _coarse(top: int) -> list[int]:
    """Capacities about 20 % apart from 0 to `top` (every one up to 8)."""
    out, n = set(range(0, min(top, 8) + 1)), 8
    while n < top:
        n = int(n * 1.2) + 1
        out.add(min(n, top))
    return sorted(out)


def fit_window(db: Path, window_id: str | None, sc: Scenario, tolerance: int = 0) -> FitReport:
    opened, segments, gauges, _hyp = window_sequence(db, window_id)
    sent = [s for seg in segments for s in seg.requests]
    if all(s.observed is None for s in sent) and any(s.gpu_observed is not None for s in sent):
        if not gauges.get("block_tokens"):
            raise PrefixFitError("the window observed GPU reuse only, and its engine's identity states no KV "
                                 "block size (vLLM's kv_block_size): there is nothing to fit")
        return fit_prefix_cache(opened, segments, int(gauges["block_tokens"]), tolerance)
    bodies = _bodies(opened)
    missing = {s.body_sha256 for s in sent} - set(bodies)
    if missing:
        raise ReproduceError(f"{len(missing)} body hash(es) the window sent are in none of its fixtures")
    size: dict[str, int] = {}
    for s in sent:
        if s.prompt_tokens is not None:
            size.setdefault(s.body_sha256, s.prompt_tokens)
    distinct = len({s.body_sha256 for s in sent})
    fits: list[Fit] = []

    def best_of(family: str, top: int, predict: Callable[[int], list[int]], named: Set[int] = frozenset()) -> Fit:
        return _best_capacity(family, top, predict, named, segments, tolerance)

    fits.append(best_of("lru_records", distinct, lambda n: _records(segments, size, n)))
    ratio = sc.pages_capacity / max(1, sc.rows_capacity)
    named = {int(gauges["rows_capacity"])} if gauges.get("rows_capacity") is not None else set()

    def pools(n: int) -> list[int]:
        named_pages = gauges.get("pages_capacity") if gauges.get("rows_capacity") == n else None
        pages = named_pages if named_pages else n * ratio
        return _replay(segments, bodies, sc, n, max(1, int(pages)))[0]

    fits.append(best_of("seed_pools", max(distinct * 4, *named, 1), pools, named))
    chains = {k: TokenSeq(render_prompt(json.loads(bodies[k]).get("messages") or [])[0], sc.block_tokens).chain
              for k in {s.body_sha256 for s in sent}}
    blocks_top = sum(len(c) for c in chains.values()) + 1
    fits.append(best_of("block_lru", blocks_top, lambda n: _blocks(segments, chains, sc, n)))
    fits.append(_best_two_tier(segments, size, distinct, tolerance))
    order = sorted(fits, key=lambda f: (-f.agreed, FAMILIES.index(f.family), f.capacity))
    best = order[0]
    policies, note = _policies_at(best, segments, size, bodies, chains, sc)
    return FitReport(opened.window_id, best.compared, best, order[1:], policies, note)


def _best_capacity(family: str, top: int, predict: Callable[[int], list[int]], named: Set[int],
                   segments: list[Segment], tolerance: int) -> Fit:
    """The capacity of `family` that agrees best with the window: a capacity the window's own gauges name
    first (it stands when it agrees on every request), else a coarse search refined around its best."""
    seen: dict[int, tuple[int, int]] = {}

    def score(n: int) -> tuple[int, int]:
        if n not in seen:
            seen[n] = _agreement(segments, predict(n), tolerance)
        return seen[n]

    for n in sorted(named):
        agreed, compared = score(n)
        if agreed == compared:
            return Fit(family, n, agreed, compared, lower_bound=n >= top)
    coarse = _coarse(top)
    for n in coarse:
        score(n)
    top_coarse = max(coarse, key=lambda n: (seen[n][0], -n))
    i = coarse.index(top_coarse)
    lo, hi = coarse[max(0, i - 1)], coarse[min(len(coarse) - 1, i + 1)]
    for n in range(lo, hi + 1):
        score(n)
    n = max(seen, key=lambda k: (seen[k][0], -k))
    return Fit(family, n, seen[n][0], seen[n][1], lower_bound=n >= top)


def _policies_at(best: Fit, segments: list[Segment], size: dict[str, int], bodies: dict[str, bytes],
                 chains: dict[str, list[bytes]], sc: Scenario) -> tuple[dict[str, int], str]:
    """Host tokens each eviction policy of the fitted family reuses on the window's requests at the
    fitted capacity, and a note saying what was compared."""
    if best.family == "lru_records":
        return ({p: sum(_records(segments, size, best.capacity, p)) for p in RECORD_POLICIES},
                "policies compared on the fitted records cache")
    if best.family == "seed_pools":
        pages = max(1, int(best.capacity * sc.pages_capacity / max(1, sc.rows_capacity)))
        return ({ev: sum(_replay(segments, bodies, msgspec.structs.replace(sc, eviction=ev), best.capacity, pages)[0])
                 for ev in ("lru_leaf", "marconi", "protect_full_prompt")},
                "policies compared on the seed's pools at the fitted rows")
    if best.family == "gpu_then_records":
        return ({"lru": sum(_two_tier(segments, size, best.front, best.capacity))},
                "the fitted two tiers (a records LRU behind the GPU's) have no other policy compared")
    # each body's block chain: its raw bytes would be read as blocks of one byte each
    return {"block_lru": sum(_blocks(segments, chains, sc, best.capacity))}, "a block LRU has no policy of its own to compare"


def render_fit(rep: FitReport) -> list[str]:
    def line(f: Fit) -> str:
        cap = f"{'>= ' if f.lower_bound else ''}{f.capacity:,}"
        unit = {"lru_records": "records", "seed_pools": "rows", "block_lru": "blocks", "vllm_blocks": "blocks",
                "gpu_then_records": f"records behind {f.front:,} GPU prompts"}[f.family]
        # an empty cache predicts no reuse at all: it agrees only with the requests that reused nothing
        empty = " (an empty cache: it predicts no reuse)" if f.capacity == 0 else ""
        return f"{f.family} of {cap} {unit}{empty}: {f.agreed:,} of {f.compared:,} requests agree ({f.share:.1%})"
    out = [f"window {rep.window_id}: best fit {line(rep.best)}"]
    out += [f"  runner-up {line(f)}" for f in rep.runners_up]
    out.append(f"{rep.note}: " + ", ".join(f"{p} {n:,} host tokens reused" for p, n in rep.policies.items())
               if rep.policies else rep.note)
    return out
