"""Answers a hostile or broken host might give (issue 52's fuzz suite): every reader of a host's answer
either returns what it read or says the answer is malformed; none raises anything else."""

from __future__ import annotations

import json
import os

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.daemon.hosts import metrics
from flare_diag.daemon.hosts.engine_profiles import PROFILES, metric_names
from flare_diag.daemon.hosts.errors import ActionFailed, answer_json
from flare_diag.daemon.hosts.target import delta_text

EXAMPLES = 20_000 if os.environ.get("FLARE_DIAG_SLOW") else 300
NAMES = ["flare_requests_active", "vllm:num_requests_running", "sglang:cached_tokens_total", "llamacpp:prompt_tokens_cached_total",
         'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}', "process_start_time_seconds"]
lines = st.one_of(
    st.text(max_size=120),
    st.builds(lambda n, v: f"{n} {v}", st.sampled_from(NAMES), st.text(max_size=12)),
    st.builds(lambda n, t: f"# TYPE {n.split('{')[0]} {t}", st.sampled_from(NAMES), st.sampled_from(["counter", "gauge", "x", ""])),
    st.builds(lambda n, h: f"# HELP {n.split('{')[0]} {h}", st.sampled_from(NAMES), st.text(max_size=40)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(lines, max_size=12), st.sampled_from(sorted(PROFILES)))
def test_any_exposition_is_read_or_is_malformed_transport(body, profile):
    try:
        m = metrics.parse("\n".join(body) + "\n", metric_names(profile, {}))
    except metrics.MetricsError:
        return
    assert set(m) == {"counters", "gauges", "labels"}


json_text = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                         max_leaves=15)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.integers(1, 50_000).map(lambda n: b"[" * n + b"]" * n)))
def test_any_answer_body_is_json_or_the_hosts_malformed_answer(raw):
    try:
        answer_json(httpx.Response(200, content=raw), "identity")
    except ActionFailed as exc:
        assert exc.error == "malformed_transport" and "\n" not in exc.detail


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.dictionaries(st.sampled_from(["content", "reasoning", "reasoning_content", "role", "x"]), json_text, max_size=4))
def test_any_stream_delta_reads_as_content_and_reasoning_text(delta):
    said, thought = delta_text(delta)
    assert isinstance(said, str) and isinstance(thought, str)


def _preflight_stream(events: list[str]) -> str | None:
    """A streamed preflight's events, [DONE] after them, read as the target reads them: its finish reason."""
    from httpx_sse import ServerSentEvent

    from flare_diag.daemon.hosts.target import _Finish
    reader = _Finish()
    for data in [*events, "[DONE]"]:
        if reader.event(ServerSentEvent(data=data)):
            break
    return reader.finish


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.one_of(json_text.map(json.dumps), st.text(max_size=20)), max_size=4))
def test_any_streamed_preflight_reads_as_its_finish_reason_or_fails_with_a_class(events):
    try:
        reason = _preflight_stream(events)
    except ActionFailed as exc:
        assert exc.error in ("malformed_transport", "engine_error", "cuda_error", "out_of_memory") and "\n" not in exc.detail
        return
    assert reason is None or isinstance(reason, str)


@settings(max_examples=EXAMPLES, deadline=None)
@given(json_text)
def test_any_models_answer_reads_as_model_ids_or_is_malformed_transport(answer):
    from flare_diag.daemon.hosts.ports import model_ids
    try:
        ids = model_ids(answer)
    except ActionFailed as exc:
        assert exc.error == "malformed_transport"
        return
    assert all(isinstance(i, str) for i in ids)


def test_a_streamed_preflight_without_choices_is_the_hosts_malformed_answer_not_ours():
    for events in ([], ['{"choices": []}'], ['{"choices": ["x"]}'], ['{"id": "x"}'], ['{"choices": 5}']):
        try:
            _preflight_stream(events)
        except ActionFailed as exc:
            assert exc.error == "malformed_transport"
        else:
            raise AssertionError(f"{events!r} read as a finish reason")
    chunks = ['{"choices": [{"delta": {"content": "ok"}, "finish_reason": null}]}',
              '{"choices": [{"delta": {}, "finish_reason": "length"}]}']
    assert _preflight_stream(chunks) == "length"
