"""Which serving adapters keep the model an answer names: only an engine whose answers name the model that
served them (vLLM), with the model its body asked for beside it; nothing from the others."""

from __future__ import annotations

import json
from types import SimpleNamespace

import anyio
import pytest

from flare_diag.daemon.hosts.ports import HttpServing, LocalServing


class Streams:
    """The one call a serving adapter's `chat` makes: what a stream of an answer naming `model` gives."""

    def __init__(self, model: str) -> None:
        self.model = model

    async def stream_chat(self, svc: str, url: str, body: bytes) -> dict:
        return {"outcome": "ok", "model_answered": self.model}


def _local(kind: str | None, answered: str) -> LocalServing:
    engine = SimpleNamespace(loaded=None if kind is None else SimpleNamespace(kind=kind))
    return LocalServing(engine, {}, HttpServing(Streams(answered), "http://127.0.0.1:1", {}))  # type: ignore[arg-type]  # a fake with the one call chat makes


BODY = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_a_local_vllm_keeps_the_answers_model_and_the_one_its_body_asked_for():
    done = anyio.run(_local("vllm", "tiny-llama").chat, BODY)
    assert (done["model_asked"], done["model_answered"]) == ("tiny-llama", "tiny-llama")


@pytest.mark.parametrize("kind", ["llamacpp", None])
def test_a_local_engine_whose_answers_echo_the_body_keeps_no_model(kind):
    done = anyio.run(_local(kind, "whatever-the-body-said").chat, BODY)
    assert "model_answered" not in done and "model_asked" not in done


def test_a_flare_hosts_answer_keeps_no_model():
    done = anyio.run(HttpServing(Streams("glm"), "http://127.0.0.1:1", {}).chat, BODY)  # type: ignore[arg-type]  # a fake with the one call chat makes
    assert "model_answered" not in done


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", json.dumps({"model": 7}).encode(), b"{}"])
def test_a_body_that_names_no_model_as_text_is_asked_for_none(body):
    done = anyio.run(_local("vllm", "tiny-llama").chat, body)
    assert done["model_asked"] == ""
