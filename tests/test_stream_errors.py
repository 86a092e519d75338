"""Every error shape a chat-completion stream can carry ends that request as failed, with the host's words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flare_diag.daemon.hosts.stream_errors import MESSAGE_CAP, stream_error

# (the event's data as decoded, the SSE event name) -> (error class, words the detail carries)
SHAPES = [
    ({"error": "some text"}, None, "engine_error", "some text"),  # a bare string, as a proxy writes it
    ({"error": {"type": "BadRequestError", "message": "context too long", "code": 400}}, None,
     "engine_error", "BadRequestError: context too long"),  # vLLM's ErrorResponse in the stream
    ({"error": {"message": "no type"}}, None, "engine_error", "no type"),
    ({"error": {"error": {"type": "internal", "message": "nested"}}}, None, "engine_error", "internal: nested"),
    ({"object": "error", "message": "old vLLM", "type": "BadRequestError"}, None, "engine_error", "old vLLM"),
    ({"error": {"type": "out_of_memory", "message": "CUDA OOM"}}, None, "out_of_memory", "CUDA OOM"),
    ({"error": {"type": "cuda_error", "message": "Xid 79"}}, None, "cuda_error", "Xid 79"),
    ({"error": None}, None, "engine_error", "stream error"),
    ("engine core died", "error", "engine_error", "engine core died"),  # an `event: error` of plain text
    ({"message": "over quota"}, "error", "engine_error", "over quota"),
    ([1, 2, 3], None, "malformed_transport", "list"),
    ("just a string", None, "malformed_transport", "str"),
]


@pytest.mark.parametrize("data,event,error,words", SHAPES)
def test_each_stream_error_shape_fails_the_request_with_the_hosts_words(data, event, error, words):
    failed = stream_error(data, event)
    assert failed is not None and failed.error == error and words in failed.detail, failed and failed.detail


def test_an_ordinary_chunk_is_no_error():
    assert stream_error({"id": "c", "choices": [{"delta": {"content": "hi"}}]}) is None


def test_a_hosts_message_is_kept_bounded_and_on_one_line():
    failed = stream_error({"error": {"message": "line one\nline two " + "x" * 5000}})
    assert failed is not None and "\n" not in failed.detail and len(failed.detail) < MESSAGE_CAP + 60


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=12)


@given(data=json_values, event=st.sampled_from([None, "error", "message"]))
def test_any_decoded_event_is_a_chunk_or_one_failure_never_an_exception(data, event):
    failed = stream_error(data, event if event != "message" else None)
    if failed is not None:
        assert failed.error in ("engine_error", "out_of_memory", "cuda_error", "malformed_transport")
        assert isinstance(failed.detail, str) and "\n" not in failed.detail
