"""flaresim's HTTP contract (contract section 1), in process."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from tests.simtools import AUTH, bodies, client

BODY = bodies()[0]


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


async def test_every_endpoint_refuses_a_missing_token_with_401():
    _h, c = client()
    async with c:
        for method, path in [("GET", "/health"), ("GET", "/metrics"), ("GET", "/flare/v1/identity"),
                             ("GET", "/manager/v1/state"), ("GET", "/routed/router/v1/backends"),
                             ("GET", "/monitoring/v1/targets"), ("GET", "/sim/v1/gpu"), ("POST", "/v1/chat/completions")]:
            r = await c.request(method, path)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication"


async def test_streamed_completion_ends_with_done_and_usage_last():
    _h, c = client()
    async with c:
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert set(last["usage"]) >= {"prompt_tokens", "completion_tokens", "prompt_tokens_details"}
    assert r.headers["x-request-id"]


async def test_metrics_parse_with_prometheus_client_and_count_the_request():
    _h, c = client()
    async with c:
        await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
        m = _metrics((await c.get("/metrics", headers=AUTH)).text)
    assert m["flare_host_cache_lookups_total"] == 1
    assert m["flare_host_cache_stores_total{checkpoint=terminal}"] == 1
    assert m["flare_requests_active"] == 0


async def test_counters_reset_on_a_new_incarnation():
    h, c = client()
    async with c:
        await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
        sha = h.sha("glm-candidate")
        await c.post("/manager/v1/load", json={"recipe": "glm-candidate", "sha256": sha}, headers=AUTH)
        m = _metrics((await c.get("/metrics", headers=AUTH)).text)
    assert m["flare_host_cache_lookups_total"] == 0 and m["flare_host_cache_records"] == 0


async def test_load_with_a_sha256_that_does_not_match_is_refused_with_409():
    _h, c = client()
    async with c:
        r = await c.post("/manager/v1/load", json={"recipe": "glm-candidate", "sha256": "0" * 64}, headers=AUTH)
    assert r.status_code == 409


async def _fault(c, kind, **kw):
    r = await c.post("/sim/v1/faults", json={"kind": kind, "at": "now", **kw}, headers=AUTH)
    assert r.status_code == 200


async def test_fault_load_failure_refuses_the_next_count_loads_then_loads_again():
    h, c = client()
    body = {"recipe": "glm-incumbent", "sha256": h.sha("glm-incumbent")}
    async with c:
        await _fault(c, "load_failure", count=2)
        codes = [(await c.post("/manager/v1/load", json=body, headers=AUTH)).status_code for _ in range(3)]
        state = (await c.get("/manager/v1/state", headers=AUTH)).json()
    assert codes == [500, 500, 200] and state["loaded"]["recipe"] == "glm-incumbent"


async def test_fault_oom_answers_500_out_of_memory():
    _h, c = client()
    async with c:
        await _fault(c, "oom")
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    assert r.status_code == 500 and r.json()["error"]["type"] == "out_of_memory"


async def test_fault_auth_rejects_the_next_request():
    _h, c = client()
    async with c:
        await _fault(c, "auth")
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    assert r.status_code == 401


async def test_fault_xid_appears_in_the_gpu_view():
    _h, c = client()
    async with c:
        await _fault(c, "xid", xid=79)
        g = (await c.get("/sim/v1/gpu", headers=AUTH)).json()
    assert g["xid_events"][0]["xid"] == 79


async def test_fault_identity_drift_changes_the_identity():
    _h, c = client()
    async with c:
        await _fault(c, "identity_drift")
        ident = (await c.get("/flare/v1/identity", headers=AUTH)).json()
    assert ident["image"] != "47ce7fde"


async def test_fault_malformed_sse_breaks_the_stream_framing():
    _h, c = client()
    async with c:
        await _fault(c, "malformed_sse")
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    assert "[DONE]" not in r.text


async def test_fault_malformed_json_breaks_a_non_streamed_body():
    _h, c = client()
    body = json.loads(BODY)
    body["stream"] = False
    async with c:
        await _fault(c, "malformed_json")
        r = await c.post("/v1/chat/completions", content=json.dumps(body).encode(), headers=AUTH)
    try:
        json.loads(r.text)
        parsed = True
    except ValueError:
        parsed = False
    assert not parsed


async def test_fault_growth_inflates_resident_memory():
    _h, c = client()
    async with c:
        await _fault(c, "growth")
        m = _metrics((await c.get("/metrics", headers=AUTH)).text)
    assert m["flare_process_resident_bytes"] >= 2**50


async def test_fault_drain_stall_keeps_a_request_active():
    _h, c = client(time_scale=1)
    async with c:
        await _fault(c, "drain_stall", duration_s=60)
        m = _metrics((await c.get("/metrics", headers=AUTH)).text)
    assert m["flare_requests_active"] == 1


async def test_fault_counter_reset_failure_keeps_counters_across_a_load():
    h, c = client()
    async with c:
        await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
        await _fault(c, "counter_reset_failure")
        await c.post("/manager/v1/load", json={"recipe": "glm-candidate", "sha256": h.sha("glm-candidate")}, headers=AUTH)
        m = _metrics((await c.get("/metrics", headers=AUTH)).text)
    assert m["flare_host_cache_lookups_total"] == 1


async def test_fault_containment_readmits_traffic_to_the_quiesced_backend():
    _h, c = client()
    async with c:
        await c.post("/routed/router/v1/backends/primary/quiesce", headers=AUTH)
        await _fault(c, "containment")
        b = (await c.get("/routed/router/v1/backends", headers=AUTH)).json()["backends"][0]
    assert b["admitted"] and b["inflight"] == 1


async def test_fault_slow_multiplies_latency():
    h, c = client()
    async with c:
        await _fault(c, "slow", factor=7)
    assert h.slow_factor == 7


async def test_fault_engine_crash_unloads_the_engine():
    _h, c = client()
    async with c:
        await _fault(c, "engine_crash")
        assert (await c.get("/health", headers=AUTH)).status_code == 503
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    assert r.status_code == 503


async def test_unknown_fault_kind_is_refused():
    _h, c = client()
    async with c:
        r = await c.post("/sim/v1/faults", json={"kind": "meteor"}, headers=AUTH)
    assert r.status_code == 400


async def test_a_fault_parameter_that_is_not_a_valid_number_is_refused_when_set_not_when_it_fires():
    _h, c = client()
    async with c:
        r = await c.post("/sim/v1/faults", json={"kind": "slow", "at": {"request": 1}, "factor": "fast"}, headers=AUTH)
        assert r.status_code == 400 and "factor" in r.json()["error"]["message"]
        ok = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    assert ok.status_code == 200


async def test_fault_malformed_json_cuts_an_event_of_a_streamed_answer():
    _h, c = client()
    async with c:
        await _fault(c, "malformed_json")
        r = await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
    datas = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    bad = []
    for d in datas:
        try:
            json.loads(d)
        except ValueError:
            bad.append(d)
    assert bad and "[DONE]" not in r.text


async def test_fault_after_request_fires_only_once_that_many_answers_completed():
    h, c = client()
    async with c:
        await c.post("/sim/v1/faults", json={"kind": "identity_drift", "at": {"after_request": 1}}, headers=AUTH)
        before = (await c.get("/flare/v1/identity", headers=AUTH)).json()
        await c.post("/v1/chat/completions", content=BODY, headers=AUTH)
        after = (await c.get("/flare/v1/identity", headers=AUTH)).json()
    assert before["image"] == "47ce7fde" and after["image"] != "47ce7fde"


# contract section 1, field by field: flaresim answers with exactly these (section 5)
CONTRACT_KEYS = {
    ("GET", "/flare/v1/identity", None): {"image", "flare_commit", "package", "model", "tensor_parallel", "draft_tokens",
                                          "host_cache_bytes", "disk_cache_enabled", "capture_enabled", "trace_enabled",
                                          "gpus", "recipe", "recipe_sha256", "incarnation"},
    ("GET", "/manager/v1/recipes/glm-candidate", None): {"name", "sha256", "content_b64"},
    ("GET", "/manager/v1/state", None): {"loaded", "busy"},
    ("POST", "/manager/v1/preview", "load"): {"ok", "steps"},
    ("POST", "/manager/v1/preview", "unload"): {"ok", "steps"},
    ("GET", "/routed/router/v1/backends", None): {"config_sha256", "backends"},
    ("GET", "/monitoring/v1/targets", None): {"targets"},
    ("GET", "/sim/v1/gpu", None): {"gpus", "xid_events"},
}


async def test_flaresim_replies_carry_exactly_the_contract_fields():
    h, c = client()
    async with c:
        for (method, path, op), keys in CONTRACT_KEYS.items():
            body = {"op": op, "recipe": "glm-incumbent" if op == "unload" else "glm-candidate"} if op else None
            if body:
                body["sha256"] = h.sha(body["recipe"])
            r = await c.request(method, path, json=body, headers=AUTH)
            assert r.status_code == 200 and set(r.json()) == keys, path
        state = (await c.get("/manager/v1/state", headers=AUTH)).json()
        assert set(state["loaded"]) == {"recipe", "sha256", "incarnation"}
        ident = (await c.get("/flare/v1/identity", headers=AUTH)).json()
        assert all(set(g) == {"uuid", "power_limit_w"} for g in ident["gpus"])


MOMENT_SPECS = {"now": "now", "request": {"request": 1}, "after_request": {"after_request": 1},
                "after_s": {"after_s": 0.001}, "load": {"load": 1}}


async def test_every_fault_kind_at_every_moment_either_fires_or_is_refused():
    """A fault spec that is accepted fires when its moment comes (issue 26: `oom@load=N` used to be
    accepted and never fire, so a test written that way tested nothing)."""
    import asyncio

    from flare_diag.fixtures.flaresim.faults import FAULT_KINDS
    silent = []
    for kind in FAULT_KINDS:
        for moment, at in MOMENT_SPECS.items():
            h, c = client()
            async with c:
                r = await c.post("/sim/v1/faults", json={"kind": kind, "at": at}, headers=AUTH)
                if r.status_code == 400:
                    continue  # refused, with its reason: nothing to fire
                assert r.status_code == 200, (kind, moment, r.text)
                await asyncio.sleep(0.01)
                # what every moment waits for: a load, then two requests, each followed by a scrape
                sha = h.sha("glm-candidate")
                calls = [c.post("/manager/v1/load", json={"recipe": "glm-candidate", "sha256": sha}, headers=AUTH)]
                for _ in range(2):
                    calls += [c.post("/v1/chat/completions", content=BODY, headers=AUTH),
                              c.get("/metrics", headers=AUTH), c.get("/sim/v1/gpu", headers=AUTH)]
                for call in calls:
                    try:  # a hang fault's load or request never answers: it has fired all the same
                        await asyncio.wait_for(call, 1)
                    except asyncio.TimeoutError:
                        pass
            if not all(f.fired for f in h.faults):
                silent.append(f"{kind}@{moment}")
    assert silent == []
