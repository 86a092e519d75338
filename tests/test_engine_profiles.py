"""Engine metric profiles against /metrics samples: what maps, and what stays not observable (None)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare_diag.daemon.hosts.engine_profiles import metric_names
from flare_diag.daemon.hosts.metrics import parse, selector

DATA = Path(__file__).resolve().parent / "data" / "metrics"


def _parse(sample: str, profile: str) -> dict:
    return parse((DATA / sample).read_text(), metric_names(profile, {}))


def test_llamacpp_recorded_sample_maps_drain_gauges_and_cached_tokens():
    m = _parse("llamacpp-0.3.36.prom", "llamacpp")  # recorded from the llama-server this project builds
    assert m["gauges"]["requests_active"] == 0 and m["gauges"]["requests_pending"] == 0
    assert m["counters"]["host_reused_tokens"] == 13921 and m["counters"]["prompt_tokens"] == 185174
    assert m["counters"]["host_lookups"] is None and m["counters"]["host_hits"] is None
    assert m["counters"]["gpu_reused_tokens"] is None and m["gauges"]["host_transfers_inflight"] is None


def test_vllm_sample_maps_running_waiting_and_prefix_cache_tokens():
    m = _parse("vllm-v1.prom", "vllm")
    assert (m["gauges"]["requests_active"], m["gauges"]["requests_pending"]) == (3, 1)
    assert m["counters"]["gpu_reused_tokens"] == 402112 and m["counters"]["host_reused_tokens"] == 135223
    assert m["counters"]["finished"] == 52  # summed over finished_reason
    assert m["counters"]["gpu_hits"] is None and m["counters"]["host_lookups"] is None


def test_sglang_sample_splits_cached_tokens_by_source():
    m = _parse("sglang.prom", "sglang")
    assert (m["gauges"]["requests_active"], m["gauges"]["requests_pending"]) == (2, 5)
    assert m["counters"]["host_reused_tokens"] == 135223 and m["counters"]["gpu_reused_tokens"] == 2.1e6
    assert m["counters"]["host_fetched_tokens"] is None and m["gauges"]["host_cache_bytes_used"] is None
    assert (m["gauges"]["host_cache_tokens_used"], m["gauges"]["host_cache_tokens_capacity"]) == (182000, 1048576)


def test_flare_sample_keeps_its_labelled_parts():
    text = ('# TYPE flare_host_cache_stores_total counter\nflare_host_cache_stores_total{checkpoint="prompt"} 3\n'
            'flare_host_cache_stores_total{checkpoint="terminal"} 2\n')
    m = parse(text)
    assert m["counters"]["stores.prompt"] == 3 and m["counters"]["stores.terminal"] == 2


@pytest.mark.parametrize("spec", ['fam{a="1"', 'fam{a=1}', "fa m"])
def test_a_malformed_selector_is_refused(spec):
    with pytest.raises(ValueError, match="selector"):
        selector(spec)


def test_samples_of_one_family_that_are_not_contiguous_are_all_counted():
    text = ('# TYPE flare_host_cache_stores_total counter\nflare_host_cache_stores_total{checkpoint="prompt"} 3\n'
            '# TYPE flare_requests_active gauge\nflare_requests_active 0\n'
            'flare_host_cache_stores_total{checkpoint="terminal"} 2\n')
    m = parse(text)
    assert m["counters"]["stores.prompt"] == 3 and m["counters"]["stores.terminal"] == 2


@pytest.mark.parametrize("sample,profile", [("llamacpp-0.3.36.prom", "llamacpp"), ("vllm-v1.prom", "vllm"),
                                            ("sglang.prom", "sglang")])
def test_reading_only_the_families_the_window_reads_gives_what_parsing_the_whole_exposition_gives(sample, profile):
    from flare_diag.daemon.hosts.metrics import families, shape
    text = (DATA / sample).read_text()
    names = metric_names(profile, {})
    assert parse(text, names) == shape(families(text), names)


def test_a_malformed_line_in_a_family_the_window_reads_is_malformed_transport():
    from flare_diag.daemon.hosts.metrics import MetricsError
    text = (DATA / "vllm-v1.prom").read_text() + 'vllm:num_requests_running{engine="1",model_name="glm"} three\n'
    with pytest.raises(MetricsError, match="not valid Prometheus text"):
        parse(text, metric_names("vllm", {}))


def test_a_line_that_names_no_metric_is_still_malformed_transport():
    from flare_diag.daemon.hosts.metrics import MetricsError
    with pytest.raises(MetricsError):
        parse((DATA / "vllm-v1.prom").read_text() + "vllm:num_requests_runn\n", metric_names("vllm", {}))


def test_a_family_the_window_never_reads_cannot_make_a_scrape_malformed():
    """An engine's own histograms (vLLM's latency buckets) are not parsed: a value there the parser
    would refuse leaves the window's counters and gauges as they are."""
    text = (DATA / "vllm-v1.prom").read_text()
    odd = text + ('# TYPE vllm:e2e_request_latency_seconds histogram\n'
                  'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5"} NaNish\n')
    assert parse(odd, metric_names("vllm", {})) == parse(text, metric_names("vllm", {}))
