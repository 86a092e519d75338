"""What each engine writes on the wire, read as the engine means it: reasoning fields, the preflight's model."""

from __future__ import annotations

import json
from pathlib import Path

from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.actions import fixture_model, preflight_body
from flare_diag.daemon.hosts.target import delta_text

REAL_VLLM = Path(__file__).resolve().parent / "data" / "metrics" / "vllm-0.32.0"


def _fixture(*bodies: dict) -> Fixture:
    raw = [json.dumps(b).encode() for b in bodies]
    return Fixture("f", raw, ["0" * 64] * len(raw), {})


def test_vllm_reasoning_field_is_read_as_reasoning():
    assert delta_text({"reasoning": "let me see"}) == ("", "let me see")


def test_reasoning_content_is_read_as_reasoning():
    assert delta_text({"reasoning_content": "hm", "content": None}) == ("", "hm")


def test_a_reasoning_field_that_is_not_text_counts_as_none():
    assert delta_text({"reasoning": 3, "content": "ok"}) == ("ok", "")


def test_real_vllm_stream_content_is_read_from_its_deltas():
    said = ""
    for line in (REAL_VLLM / "stream-2.sse").read_text().splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices") or []:
                said += delta_text(ch.get("delta") or {})[0]
    assert said  # the tiny model answered four tokens of content


def test_preflight_names_the_model_the_fixtures_name():
    body = json.loads(preflight_body(fixture_model({"a": _fixture({"model": "tiny"}, {"model": "other"})})))
    assert body["model"] == "tiny"


def test_preflight_without_a_named_model_sends_no_model_field():
    assert "model" not in json.loads(preflight_body(fixture_model({"a": _fixture({"messages": []})})))


def test_real_vllm_refuses_a_model_it_does_not_serve_by_name():
    """Why the preflight must name the served model: vLLM's recorded answer to any other name."""
    answer = json.loads((REAL_VLLM / "wrong-model.json").read_text())
    served = [m["id"] for m in json.loads((REAL_VLLM / "models.json").read_text())["data"]]
    assert answer["error"]["code"] == 404 and "other" not in served and served == ["glm"]
