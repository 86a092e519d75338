"""One stream, one answer: every chunk of a streamed completion names the same completion id and model. A stream
whose chunks go on under another (two backends' answers spliced by a router) is a malformed answer, never
measured; real vLLM streams, recorded, pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from httpx_sse import ServerSentEvent

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.target import _Answer

RECORDED = sorted((Path(__file__).resolve().parent / "data" / "metrics" / "vllm-0.32.0").glob("stream-*.sse"))


def _events(path: Path) -> list[str]:
    return [line[len("data: "):] for line in path.read_text().splitlines() if line.startswith("data: ")]


def _read(datas: list[str]) -> _Answer:
    answer = _Answer()
    for k, data in enumerate(datas):
        if answer.event(ServerSentEvent(data=data), k, lambda: "read"):
            break
    return answer


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_a_recorded_vllm_stream_is_one_answer(path):
    answer = _read(_events(path))
    assert answer.answer_id.startswith("chatcmpl-") and answer.fields()["model_answered"] == "glm"


def _renamed_after(datas: list[str], k: int, field: str, value: str) -> list[str]:
    out = []
    for i, d in enumerate(datas):
        if i >= k and d != "[DONE]":
            d = json.dumps({**json.loads(d), field: value})
        out.append(d)
    return out


def test_a_stream_that_goes_on_under_another_completion_id_is_a_malformed_answer():
    datas = _renamed_after(_events(RECORDED[0]), 2, "id", "chatcmpl-from-a-second-backend")
    with pytest.raises(ActionFailed) as got:
        _read(datas)
    assert got.value.error == "malformed_transport"
    assert "event 3 names id 'chatcmpl-from-a-second-backend'" in str(got.value) and "two answers in one stream" in str(got.value)


def test_a_stream_that_goes_on_naming_another_model_is_a_malformed_answer():
    with pytest.raises(ActionFailed, match="names model 'other', the stream's first named 'glm'"):
        _read(_renamed_after(_events(RECORDED[0]), 3, "model", "other"))


def test_chunks_that_name_no_id_are_not_taken_for_another_answer():
    datas = [json.dumps({k: v for k, v in json.loads(d).items() if k != "id" or i == 0}) if d != "[DONE]" else d
             for i, d in enumerate(_events(RECORDED[0]))]
    assert _read(datas).fields()["model_answered"] == "glm"


@pytest.mark.parametrize("body, names", [
    (b'{"model": "m", "messages": [], "request_id": "fixed-1"}', True),  # vLLM takes the completion id from it
    (b'{"model": "m", "messages": [], "rid": "fixed-1"}', True),  # SGLang likewise
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', False),
])
def test_a_body_that_may_name_its_answers_id_is_told_apart(body, names):
    from flare_diag.daemon.hosts.actions import names_its_own_id
    assert names_its_own_id(body) is names
