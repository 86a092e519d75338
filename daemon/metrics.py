"""/metrics to the daemon's counter, gauge and identity names, via prometheus-client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# daemon name -> (contract metric family, label whose value suffixes the name, or None)
COUNTERS = {
    "host_lookups": "flare_host_cache_lookups", "host_hits": "flare_host_cache_hits",
    "host_fetched_tokens": "flare_host_cache_fetched_tokens", "host_reused_tokens": "flare_host_cache_reused_tokens",
    "stores": "flare_host_cache_stores", "evictions": "flare_host_cache_evictions",
    "compactions": "flare_host_cache_compactions", "gpu_queries": "flare_gpu_prefix_cache_queries",
    "gpu_hits": "flare_gpu_prefix_cache_hits", "gpu_reused_tokens": "flare_gpu_prefix_cache_reused_tokens",
    "finished": "flare_requests_finished", "prompt_tokens": "flare_prompt_tokens",
    "generation_tokens": "flare_generation_tokens",
}
GAUGES = {
    "requests_active": "flare_requests_active", "requests_pending": "flare_requests_pending",
    "requests_retiring": "flare_requests_retiring", "host_transfers_inflight": "flare_host_transfers_inflight",
    "host_transfers_waiting": "flare_host_transfers_waiting", "host_cache_records": "flare_host_cache_records",
    "host_cache_bytes_used": "flare_host_cache_bytes_used", "host_cache_bytes_capacity": "flare_host_cache_bytes_capacity",
    "rows_used": "flare_host_cache_rows_used", "rows_capacity": "flare_host_cache_rows_capacity",
    "pages_used": "flare_host_cache_pages_used", "pages_capacity": "flare_host_cache_pages_capacity",
    "resident_bytes": "flare_process_resident_bytes",
}
INFO = {"build": "flare_build_info", "incarnation": "flare_incarnation_info"}


class MetricsError(ValueError):
    """The exposition could not be parsed (malformed transport)."""


def parse(text: str, names: dict[str, str] | None = None) -> dict:
    """{counters, gauges, labels}; a contract name this engine lacks is None (not observable)."""
    names = names or {}
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as exc:  # the parser raises ValueError and others on bad input
        raise MetricsError(f"/metrics is not valid Prometheus text: {exc}") from None

    def fam(contract: str):
        return families.get(names.get(contract, contract))

    counters: dict[str, float | None] = {}
    for key, name in COUNTERS.items():
        f = fam(name)
        if f is None:
            counters[key] = None
            continue
        samples = [s for s in f.samples if not s.name.endswith("_created")]
        labelled = [s for s in samples if s.labels]
        if labelled:
            for s in labelled:
                counters[f"{key}.{next(iter(s.labels.values()))}"] = s.value
        else:
            counters[key] = samples[0].value if samples else None
    gauges: dict[str, float | None] = {}
    for key, name in GAUGES.items():
        f = fam(name)
        gauges[key] = f.samples[0].value if f is not None and f.samples else None
    labels: dict = {}
    for name in INFO.values():
        f = fam(name)
        if f is not None and f.samples:
            labels.update(f.samples[0].labels)
    return {"counters": counters, "gauges": gauges, "labels": labels}
