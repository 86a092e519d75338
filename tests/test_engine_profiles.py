"""Engine metric profiles against /metrics samples: what maps, and what stays not observable (None)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare_diag.daemon.hosts.engine_profiles import metric_names
from flare_diag.daemon.hosts.metrics import parse, selector

ROOT = Path(__file__).resolve().parent.parent

DATA = Path(__file__).resolve().parent / "data" / "metrics"


def _parse(sample: str, profile: str) -> dict:
    return parse((DATA / sample).read_text(), metric_names(profile, {}))


def test_llamacpp_recorded_sample_maps_drain_gauges_and_cached_tokens():
    m = _parse("llamacpp-0.3.36.prom", "llamacpp")  # recorded from the llama-server this project builds
    assert m["gauges"]["requests_active"] == 0 and m["gauges"]["requests_pending"] == 0
    assert m["counters"]["host_reused_tokens"] == 13921 and m["counters"]["generation_tokens"] is not None
    assert m["counters"]["host_lookups"] is None and m["counters"]["host_hits"] is None
    assert m["counters"]["gpu_reused_tokens"] is None and m["gauges"]["host_transfers_inflight"] is None


REAL_VLLM = "vllm-0.32.0/after-two-repeats.prom"  # recorded from vLLM 0.32.0 (CPU build) after one prompt sent twice


def test_real_vllm_exposition_maps_gpu_reuse_to_what_prefill_skipped():
    m = _parse(REAL_VLLM, "vllm")
    assert (m["gauges"]["requests_active"], m["gauges"]["requests_pending"]) == (0, 0)
    # the second request's usage said cached_tokens 256 (stream-2.sse): two 128-token blocks
    assert m["counters"]["gpu_reused_tokens"] == 256 and m["counters"]["prompt_tokens"] == 754
    assert m["counters"]["finished"] == 2 and m["counters"]["gpu_hits"] is None


def test_real_vllm_host_reuse_is_not_observable_since_it_counts_loads_that_failed():
    """vLLM 0.32 counts a KV connector's tokens when it schedules their load, failed loads included
    (tests/test_peer_vllm.py): host reuse reads as not observable, never as a number."""
    assert _parse(REAL_VLLM, "vllm")["counters"]["host_reused_tokens"] is None


def test_a_connector_match_that_was_never_loaded_is_not_host_reuse():
    """vLLM counts a KV connector's matched tokens at scheduling; a load that fails recomputes them."""
    text = (DATA / REAL_VLLM).read_text().replace(
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="glm"} 0.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="glm"} 66448.0').replace(
        'source="external_kv_transfer"} 0.0', 'source="external_kv_transfer"} 66448.0')
    assert _parse_text(text)["counters"]["host_reused_tokens"] is None


def _parse_text(text: str) -> dict:
    return parse(text, metric_names("vllm", {}))


def test_llamacpp_prompt_tokens_are_not_mapped_since_its_counter_leaves_cached_tokens_out():
    """llama-server's prompt_tokens_total is 'excluding cached tokens' (server-task.cpp); the contract's
    counts every prompt token."""
    text = (DATA / "llamacpp-0.3.36.prom").read_text()
    assert "excluding cached tokens" in text
    assert _parse("llamacpp-0.3.36.prom", "llamacpp")["counters"]["prompt_tokens"] is None


def test_sglang_sample_splits_cached_tokens_by_source():
    m = _parse("sglang.prom", "sglang")
    assert (m["gauges"]["requests_active"], m["gauges"]["requests_pending"]) == (2, 5)
    assert m["counters"]["host_reused_tokens"] == 135223 and m["counters"]["gpu_reused_tokens"] == 2.1e6
    assert m["counters"]["prompt_tokens"] == 128902 + 8.0e6  # both is_streaming children
    assert m["counters"]["finished"] == 12 + 3480  # num_requests_total: each finished request, both children
    assert m["counters"]["host_fetched_tokens"] is None and m["gauges"]["host_cache_bytes_used"] is None
    assert (m["gauges"]["host_cache_tokens_used"], m["gauges"]["host_cache_tokens_capacity"]) == (182000, 1048576)


SGLANG_HELP = ("# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).\n"
               "# TYPE sglang:cached_tokens_total counter\n")


def _sglang(cached_lines: str, help_text: str = SGLANG_HELP) -> dict:
    return parse(help_text + cached_lines, metric_names("sglang", {}))["counters"]


def test_sglang_host_reuse_before_any_host_hit_is_zero_since_its_child_appears_on_first_count():
    """A fresh incarnation declares the split family with no child; device reuse came first."""
    assert _sglang("")["host_reused_tokens"] == 0 and _sglang("")["gpu_reused_tokens"] == 0
    c = _sglang('sglang:cached_tokens_total{model_name="glm",cache_source="device"} 512.0\n')
    assert (c["gpu_reused_tokens"], c["host_reused_tokens"]) == (512, 0)


def test_sglang_requests_counted_without_a_split_leave_host_and_device_reuse_not_observable():
    """A request without cached_tokens_details counts under cache_source="total" alone (SGLang's
    multi-tokenizer path dropped them before its fix): no part can be told, the device's included."""
    c = _sglang('sglang:cached_tokens_total{model_name="glm",cache_source="device"} 512.0\n'
                'sglang:cached_tokens_total{model_name="glm",cache_source="total"} 900.0\n')
    assert c["host_reused_tokens"] is None and c["gpu_reused_tokens"] is None


def test_an_sglang_release_before_the_split_has_no_host_or_device_reuse():
    old_help = ("# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
                "# TYPE sglang:cached_tokens_total counter\n")
    assert _sglang("", old_help)["host_reused_tokens"] is None
    c = _sglang('sglang:cached_tokens_total{model_name="glm"} 2688.0\n', old_help)
    assert c["host_reused_tokens"] is None and c["gpu_reused_tokens"] is None


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


@pytest.mark.parametrize("sample,profile", [("llamacpp-0.3.36.prom", "llamacpp"), (REAL_VLLM, "vllm"),
                                            ("sglang.prom", "sglang")])
def test_reading_only_the_families_the_window_reads_gives_what_parsing_the_whole_exposition_gives(sample, profile):
    from flare_diag.daemon.hosts.metrics import declared_splits, families, shape
    text = (DATA / sample).read_text()
    names = metric_names(profile, {})
    assert parse(text, names) == shape(families(text), names, declared_splits(text))


def test_a_malformed_line_in_a_family_the_window_reads_is_malformed_transport():
    from flare_diag.daemon.hosts.metrics import MetricsError
    text = (DATA / REAL_VLLM).read_text() + 'vllm:num_requests_running{engine="1",model_name="glm"} three\n'
    with pytest.raises(MetricsError, match="not valid Prometheus text"):
        parse(text, metric_names("vllm", {}))


def test_a_line_that_names_no_metric_is_still_malformed_transport():
    from flare_diag.daemon.hosts.metrics import MetricsError
    with pytest.raises(MetricsError):
        parse((DATA / REAL_VLLM).read_text() + "vllm:num_requests_runn\n", metric_names("vllm", {}))


def test_a_family_the_window_never_reads_cannot_make_a_scrape_malformed():
    """An engine's own histograms (vLLM's latency buckets) are not parsed: a value there the parser
    would refuse leaves the window's counters and gauges as they are."""
    text = (DATA / REAL_VLLM).read_text()
    odd = text + ('# TYPE vllm:e2e_request_latency_seconds histogram\n'
                  'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5"} NaNish\n')
    assert parse(odd, metric_names("vllm", {})) == parse(text, metric_names("vllm", {}))


def test_real_vllm_per_request_queue_and_prefill_times_are_read_as_sum_and_count():
    # vLLM 0.32.0's request_queue_time_seconds and request_prefill_time_seconds histograms, recorded before
    # and after two requests: their sums' changes are those requests' own times (vllm/v1/metrics/stats.py)
    before, after = _parse("vllm-0.32.0/before.prom", "vllm")["counters"], _parse(REAL_VLLM, "vllm")["counters"]
    assert before["engine_queue_s_count"] == 0 and after["engine_queue_s_count"] == 2
    assert after["engine_queue_s_sum"] == pytest.approx(0.00020225699881848413)
    assert after["engine_prefill_s_count"] == 2 and after["engine_prefill_s_sum"] == pytest.approx(0.059862698000870296)


def test_an_engine_that_exports_no_request_times_reads_them_as_not_observable():
    m = _parse("llamacpp-0.3.36.prom", "llamacpp")["counters"]
    assert all(m[k] is None for k in ("engine_queue_s_sum", "engine_queue_s_count", "engine_prefill_s_sum",
                                      "engine_prefill_s_count"))


def test_sglang_sample_reads_its_per_request_queue_time_and_no_prefill_time():
    m = _parse("sglang.prom", "sglang")["counters"]
    assert m["engine_queue_s_sum"] == pytest.approx(0.0123) and m["engine_queue_s_count"] == 3
    assert m["engine_prefill_s_sum"] is None and m["engine_prefill_s_count"] is None


def _profile(tmp_path: Path, kind: str, extra: str = ""):
    from flare_diag.daemon.cli.commands import main
    from flare_diag.daemon.hosts.site import load_site
    folder = tmp_path / kind
    assert main(["init-site", kind, str(folder)]) == 0
    for token in folder.glob("*.token"):
        token.write_text("t0ken-for-the-test\n")
    profile = folder / f"{kind}.toml"
    profile.write_text(profile.read_text() + extra)
    return load_site(profile)


def test_an_sglang_site_allows_a_fresh_incarnation_its_warm_up_and_no_other_engine_anything(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import startup_requests
    assert startup_requests(_profile(tmp_path, "sglang")) == (16, 8)
    assert startup_requests(_profile(tmp_path, "flare")) == (0, 0)


def test_an_sglang_site_that_remaps_its_finished_requests_is_allowed_no_warm_up(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import startup_requests
    site = _profile(tmp_path, "sglang", '\n[metrics]\nflare_requests_finished = "my:finished"\n')
    assert startup_requests(site) == (0, 0)


def test_what_a_kv_connector_found_outside_the_engine_is_read_from_vllms_own_counter():
    """vLLM counts the tokens a connector matched in its store as it schedules a request (before any load)."""
    text = (DATA / REAL_VLLM).read_text()
    assert 'vllm:external_prefix_cache_hits_total{engine="0",model_name="glm"} 0.0' in text
    assert parse(text, metric_names("vllm", {}))["counters"]["external_found_tokens"] == 0
    found = text.replace('vllm:external_prefix_cache_hits_total{engine="0",model_name="glm"} 0.0',
                         'vllm:external_prefix_cache_hits_total{engine="0",model_name="glm"} 480.0')
    assert parse(found, metric_names("vllm", {}))["counters"]["external_found_tokens"] == 480


def test_what_sglangs_l3_store_gave_counts_as_found_outside_the_engine_and_is_zero_until_its_child_appears():
    assert _sglang('sglang:cached_tokens_total{model_name="glm",cache_source="device"} 512.0\n')["external_found_tokens"] == 0
    c = _sglang('sglang:cached_tokens_total{model_name="glm",cache_source="storage"} 96.0\n')
    assert (c["external_found_tokens"], c["host_reused_tokens"]) == (96, 0)


def _bodies(*bodies: dict):
    import hashlib
    import json

    from flare_diag.daemon.hosts.fixture import Fixture
    raw = [json.dumps(b).encode() for b in bodies]
    return {"f": Fixture("f", raw, [hashlib.sha256(r).hexdigest() for r in raw], {})}


def _engine_site(tmp_path: Path, kind: str, force: int = 0):
    """`init-site KIND` as an operator fills in its local engine (the binary, the model); `force` of its recipes
    given vLLM's --enable-force-include-usage."""
    import sys

    from flare_diag.daemon.cli.commands import main
    from flare_diag.daemon.hosts.site import load_site
    assert main(["init-site", kind, str(tmp_path / kind)]) == 0
    for token in (tmp_path / kind).glob("*.token"):
        token.write_text("t0ken-for-the-test\n")
    profile = tmp_path / kind / f"{kind}.toml"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    text = (profile.read_text().replace("REPLACE-/path/to/vllm-venv/bin/python", sys.executable)
            .replace("REPLACE-/path/to/llama-server", sys.executable)
            .replace("REPLACE-model-folder", str(tmp_path / "model")).replace("REPLACE-model.gguf", sys.executable)
            .replace('"--served-model-name",', '"--enable-force-include-usage", "--served-model-name",', force))
    profile.write_text(text)
    return load_site(profile)


ASKS = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}
BARE = {"messages": [], "stream": True}


@pytest.mark.parametrize("kind", ["vllm", "sglang", "llamacpp"])
def test_a_body_that_does_not_ask_for_usage_is_named_where_the_engine_streams_usage_only_when_asked(tmp_path, kind):
    from flare_diag.daemon.hosts.profile_rules import usage_unasked
    fixtures = _bodies(ASKS, BARE, BARE)
    site = _profile(tmp_path, kind) if kind == "sglang" else _engine_site(tmp_path, kind)
    assert usage_unasked(site.profile, fixtures) == f"fixture f body 1 (sha256 {fixtures['f'].sha256[1][:12]})"


def test_a_flare_host_is_held_to_no_usage_request_since_the_contract_has_it_in_every_stream(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import usage_unasked
    assert usage_unasked(_profile(tmp_path, "flare").profile, _bodies(BARE)) is None


def test_bodies_that_all_ask_for_usage_are_not_held_back_on_any_engine(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import usage_unasked
    assert usage_unasked(_engine_site(tmp_path, "vllm").profile, _bodies(ASKS, ASKS)) is None


def test_a_vllm_whose_every_recipe_forces_usage_takes_bodies_that_do_not_ask(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import usage_unasked
    assert usage_unasked(_engine_site(tmp_path / "both", "vllm", force=2).profile, _bodies(BARE)) is None
    # one recipe that does not force it fails every body sent to its incarnation
    assert usage_unasked(_engine_site(tmp_path / "one", "vllm", force=1).profile, _bodies(BARE)) is not None


def test_a_local_vllm_recipe_without_prompt_tokens_details_is_named_as_reporting_no_cached_tokens(tmp_path):
    from flare_diag.daemon.hosts.profile_rules import cached_tokens_unreported
    from flare_diag.daemon.hosts.site import load_site
    site = _engine_site(tmp_path, "vllm")
    assert cached_tokens_unreported(site.profile) == ("--enable-prompt-tokens-details", [])  # init-site's recipes carry it
    profile = tmp_path / "vllm" / "vllm.toml"
    profile.write_text(profile.read_text().replace('"--enable-prompt-tokens-details"', '"--enable-prefix-caching"', 1))
    assert cached_tokens_unreported(load_site(profile).profile) == ("--enable-prompt-tokens-details", ["incumbent"])
    assert cached_tokens_unreported(_profile(tmp_path, "flare").profile) is None


def test_plan_check_with_a_site_refuses_bodies_its_engine_would_answer_without_usage(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    from tests.test_contract_host import _fixture_with
    _engine_site(tmp_path / "site", "llamacpp")
    site = tmp_path / "site" / "llamacpp" / "llamacpp.toml"
    plan = tmp_path / "plan.toml"
    plan.write_text((ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_text())
    assert main(["plan", "check", str(plan), "--site", str(site)]) == 0  # the shipped bodies all ask
    capsys.readouterr()
    _fixture_with(tmp_path, "c1-52", {"stream_options": None}, body=None)  # found beside the plan first
    assert main(["plan", "check", str(plan), "--site", str(site)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fixture c1-52 body 0 (sha256 " in err and "does not ask for usage" in err, err
    assert main(["plan", "check", str(plan)]) == 0  # without a site, which engine answers is not known
