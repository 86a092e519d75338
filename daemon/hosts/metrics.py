"""/metrics to the daemon's counter, gauge and identity names, via prometheus-client's parser."""

from __future__ import annotations

import functools
import re

from prometheus_client.parser import text_string_to_metric_families

# daemon name -> (contract metric family, label that splits it into named parts, or None)
COUNTERS = {
    "host_lookups": ("flare_host_cache_lookups", None), "host_hits": ("flare_host_cache_hits", None),
    "host_fetched_tokens": ("flare_host_cache_fetched_tokens", None),
    "host_reused_tokens": ("flare_host_cache_reused_tokens", None),
    "stores": ("flare_host_cache_stores", "checkpoint"), "evictions": ("flare_host_cache_evictions", "pool"),
    "compactions": ("flare_host_cache_compactions", None), "gpu_queries": ("flare_gpu_prefix_cache_queries", None),
    "gpu_hits": ("flare_gpu_prefix_cache_hits", None), "gpu_reused_tokens": ("flare_gpu_prefix_cache_reused_tokens", None),
    "finished": ("flare_requests_finished", None), "prompt_tokens": ("flare_prompt_tokens", None),
    "generation_tokens": ("flare_generation_tokens", None),
    # beside the contract (docs/engines.md): tokens a request found in a cache kept outside the engine (a KV
    # connector's store, an L3 tier), counted as they are found; read only to hold a fresh incarnation's first
    # request to an empty cache (policies/phases.py), never as reuse
    "external_found_tokens": ("flare_external_cache_found_tokens", None),
}
GAUGES = {
    "requests_active": "flare_requests_active", "requests_pending": "flare_requests_pending",
    "requests_retiring": "flare_requests_retiring", "host_transfers_inflight": "flare_host_transfers_inflight",
    "host_transfers_waiting": "flare_host_transfers_waiting", "host_cache_records": "flare_host_cache_records",
    "host_cache_bytes_used": "flare_host_cache_bytes_used", "host_cache_bytes_capacity": "flare_host_cache_bytes_capacity",
    "rows_used": "flare_host_cache_rows_used", "rows_capacity": "flare_host_cache_rows_capacity",
    "pages_used": "flare_host_cache_pages_used", "pages_capacity": "flare_host_cache_pages_capacity",
    "resident_bytes": "flare_process_resident_bytes",
    # engines that size their host cache in tokens (SGLang's HiCache) rather than rows and pages
    "host_cache_tokens_used": "flare_host_cache_tokens_used",
    "host_cache_tokens_capacity": "flare_host_cache_tokens_capacity",
    # prometheus_client's `ProcessCollector` gauge (its default registry exports it on Linux); recorded on a
    # real vLLM 0.32's /metrics (issue 51), where it is the API server's process. Not checked for SGLang. A
    # value that moves within one incarnation is an unseen restart
    "process_start_time": "process_start_time_seconds",
}
INFO = {"build": "flare_build_info", "incarnation": "flare_incarnation_info"}
# Per-request times an engine may export as histograms, beside the contract (which has none): the daemon
# reads each one's _sum and _count as two counters, so that around one request at C1 their changes are that
# request's own figure (a change of count other than 1 gives none). Shown, never decided on (contract 5).
TIMINGS = {"engine_queue_s": "flare_request_queue_seconds", "engine_prefill_s": "flare_request_prefill_seconds"}


def contract_families() -> dict[str, str]:
    """Every family a site's [metrics] table may map: contract family name -> the daemon's short name."""
    return {**{fam: name for name, (fam, _label) in COUNTERS.items()}, **{fam: name for name, fam in GAUGES.items()},
            **{fam: name for name, fam in TIMINGS.items()}}


_SELECTOR = re.compile(r'^([^{}\s]+)(?:\{(.*)\})?$')
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"\s*,?')


class MetricsError(ValueError):
    """The exposition could not be parsed (malformed transport)."""


@functools.lru_cache(maxsize=1024)
def selector(spec: str) -> tuple[str, dict[str, str]]:
    """'family' or 'family{label="value",...}' -> (family, required labels)."""
    m = _SELECTOR.match(spec.strip())
    if not m:
        raise ValueError(f"metric selector {spec!r}: expected family or family{{label=\"value\"}}")
    labels, rest = {}, m.group(2) or ""
    pos = 0
    while pos < len(rest):
        lm = _MATCHER.match(rest, pos)
        if not lm:
            raise ValueError(f"metric selector {spec!r}: cannot read the labels {rest!r}")
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    return m.group(1), labels


# the sample and comment names a family may appear under (text format 0.0.4 and OpenMetrics)
_SUFFIXES = ("", "_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?=[{ \t])")


def _read_names(names: dict[str, str] | None) -> frozenset[str]:
    """Every sample and comment name under which a family the daemon reads can appear."""
    return _read_names_of(frozenset((names or {}).items()))


@functools.lru_cache(maxsize=64)
def _read_names_of(names: frozenset[tuple[str, str]]) -> frozenset[str]:
    chosen = dict(names)
    families = {selector(chosen.get(c, c))[0]
                for c in [*(f for f, _split in COUNTERS.values()), *GAUGES.values(), *INFO.values(), *TIMINGS.values()]}
    return frozenset(f + suffix for f in families for suffix in _SUFFIXES)


def _read_lines(text: str, wanted: frozenset[str]) -> str:
    """The exposition's lines of the families the daemon reads. An engine's /metrics is mostly
    families it never reads (vLLM's latency histograms, a bucket a line, per model and engine), and
    the parser is pure Python: it is handed only these. A line that does not begin with a metric
    name is kept, so that a malformed exposition is still the parser's to refuse."""
    kept = []
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE", "UNIT") and parts[2] not in wanted:
                continue
        else:
            m = _NAME.match(line)
            if m is not None and m.group() not in wanted:
                continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def parse(text: str, names: dict[str, str] | None = None) -> dict:
    """{counters, gauges, labels}; a contract name this engine lacks is None (not observable).

    `names` maps a contract family to this engine's selector. Samples that match are summed (an
    engine with several data-parallel ranks reports one per rank); `_created` samples are skipped.
    """
    kept = _read_lines(text, _read_names(names))
    return shape(families(kept), names, declared_splits(kept))


def declared_splits(text: str) -> frozenset[str]:
    """The families of LAZY_SPLITS whose HELP line says they are split (engine_profiles.LazySplit)."""
    from flare_diag.daemon.hosts.engine_profiles import LAZY_SPLITS
    found = set()
    for family, split in LAZY_SPLITS.items():
        for help_name in (family, family + "_total"):
            at = text.find(f"# HELP {help_name} ")
            if at >= 0 and split.declared_by in text[at:text.find("\n", at)]:
                found.add(family)
    return frozenset(found)


class _Zero:
    """The sample a lazily split family's absent part stands for: nothing counted under it yet."""

    name: str = ""
    labels: dict[str, str] = {}
    value: float = 0.0


_ZERO = _Zero()


def _split_part(family: str, want: dict[str, str], found: list, chosen: list) -> list:
    """A lazily split family's part (engine_profiles.LazySplit): none at all once any request was counted
    under the fallback (its split is unknown, so every part may be short); 0 while the part's child has
    not appeared and every sample carries the split label; else the samples chosen."""
    from flare_diag.daemon.hosts.engine_profiles import LAZY_SPLITS
    split = LAZY_SPLITS[family]
    if split.label not in want:
        return chosen
    if any(s.labels.get(split.label) == split.fallback for s in found):
        return []
    if not chosen and all(s.labels.get(split.label) is not None for s in found):
        return [_ZERO]
    return chosen


def families(text: str) -> dict[str, list]:
    """Family name -> samples of a Prometheus text exposition, parsed by prometheus-client."""
    found: dict[str, list] = {}
    try:
        for f in text_string_to_metric_families(text):
            # a family whose samples are not contiguous comes back in pieces (a stray counter piece
            # as an untyped family named with its _total suffix): keep every piece under one name
            name = f.name
            if f.type == "unknown" and name.endswith("_total") and name[:-6] in found:
                name = name[:-6]
            found.setdefault(name, []).extend(f.samples)
    except Exception as exc:  # the parser raises ValueError and others on bad input
        raise MetricsError(f"/metrics is not valid Prometheus text: {exc}") from None
    return found


def shape(families: dict[str, list], names: dict[str, str] | None = None,
          splits: frozenset[str] = frozenset()) -> dict:
    """{counters, gauges, labels} from parsed families (family name -> samples with name, labels, value);
    `splits`: the families declared split by a label whose children appear on first increment."""
    names = names or {}

    def samples(contract: str):
        fam, want = selector(names.get(contract, contract))
        found = families.get(fam)
        if found is None:
            return None
        found = [s for s in found if not s.name.endswith("_created")]
        chosen = [s for s in found if all(s.labels.get(k) == v for k, v in want.items())]
        return _split_part(fam, want, found, chosen) if fam in splits else chosen

    counters: dict[str, float | None] = {}
    for key, (family, split) in COUNTERS.items():
        ss = samples(family)
        if ss is None or not ss:
            counters[key] = None
        elif split is not None and any(split in s.labels for s in ss):
            for s in ss:
                part = f"{key}.{s.labels.get(split, '')}"
                counters[part] = counters.get(part, 0.0) + s.value  # type: ignore[operator]  # a counter sample's value is a float
        else:
            counters[key] = sum(s.value for s in ss)
    for key, family in TIMINGS.items():
        ss = samples(family) or []
        for part in ("sum", "count"):
            got = [s.value for s in ss if s.name.endswith(f"_{part}")]
            counters[f"{key}_{part}"] = sum(got) if got else None
    gauges: dict[str, float | None] = {}
    for key, family in GAUGES.items():
        ss = samples(family)
        gauges[key] = sum(s.value for s in ss) if ss else None
    labels: dict = {}
    for family in INFO.values():
        ss = samples(family)
        if ss:
            labels.update(ss[0].labels)
    return {"counters": counters, "gauges": gauges, "labels": labels}
