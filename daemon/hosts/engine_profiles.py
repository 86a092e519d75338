"""Metric maps for engines other than Flare: contract family -> the engine's own metric selector.

A family an engine does not expose is left out, so it reads as not observable (None), never as
zero. prometheus-client names a counter family without its `_total` suffix. docs/engines.md says,
per engine, what maps to what and what cannot be observed.
"""

from __future__ import annotations

from typing import NamedTuple

PROFILES: dict[str, dict[str, str]] = {
    "flare": {},
    # llama.cpp as vendored in llama-cpp-python 0.3.36 (fixtures/engines/llamacpp/build.sh builds it): every
    # family is rendered by server_task_result_metrics::to_metrics in tools/server/server-task.cpp
    "llamacpp": {
        "flare_requests_active": "llamacpp:requests_processing",  # gauge, n_processing_slots
        "flare_requests_pending": "llamacpp:requests_deferred",   # gauge, n_tasks_deferred
        # counter, metrics.n_prompt_cached: the prompt tokens a slot took from its own state or from a
        # host-RAM prompt-cache entry instead of computing them; the request's usage reports the same
        # figure as prompt_tokens_details.cached_tokens (server-task.cpp, n_prompt_tokens_cache)
        "flare_host_cache_reused_tokens": "llamacpp:prompt_tokens_cached",
        # counter, metrics.predict.count: added by metrics_on_prediction from the slot's callback_on_reset,
        # which release() calls as the request ends (server-context.cpp), before the slot shows idle
        "flare_generation_tokens": "llamacpp:tokens_predicted",
        # Not flare_prompt_tokens: llamacpp:prompt_tokens_total is "Number of prompt tokens processed,
        # excluding cached tokens" (metrics.prompt.count), where the contract's counts every prompt token
    },
    # vLLM 0.32.0: every family below is registered in vllm/v1/metrics/loggers.py (PrometheusStatLogger);
    # the prompt-token split is PromptTokenStats in vllm/v1/metrics/stats.py, whose invariant is
    # local_cache_hit + external_kv_transfer = the tokens prefill skipped (the request's cached_tokens).
    "vllm": {
        "flare_requests_active": "vllm:num_requests_running",    # loggers.py: gauge, requests in model execution
        "flare_requests_pending": "vllm:num_requests_waiting",   # loggers.py: gauge, requests waiting
        # reuse is only what prefill actually skipped: a prefix-cache or connector *match*
        # (vllm:prefix_cache_hits, vllm:external_prefix_cache_hits) is counted at scheduling, before any
        # load, and a KV connector whose load then fails recomputes tokens it had matched
        "flare_gpu_prefix_cache_reused_tokens": 'vllm:prompt_tokens_by_source{source="local_cache_hit"}',
        # No host reuse: prompt_tokens_by_source{source="external_kv_transfer"} counts the tokens the
        # scheduler handed a KV connector to load, when it scheduled them. A real vLLM 0.32.0 whose
        # connector failed every load (kv_load_failure_policy "recompute": the scheduler's
        # _update_requests_with_invalid_blocks recomputes them) still counted 24,960 of them on a phase,
        # and each request's cached_tokens with them (tests/test_peer_vllm.py); no counter of failed
        # loads is exported. A site whose connector reports its failures may map it in [metrics].
        # What a KV connector found in its store, not what was reused: the scheduler records
        # connector_prefix_cache_hits = num_external_computed_tokens, the tokens the connector's
        # get_num_new_matched_tokens matched, as it schedules the request and before any load
        # (v1/core/sched/scheduler.py); loggers.py counts them per engine. On a fresh incarnation
        # nothing the engine stored could be found there yet: a first request that finds some meets a store
        # that outlived the last one (LMCache's remote server, Mooncake, a shared-storage directory)
        "flare_external_cache_found_tokens": "vllm:external_prefix_cache_hits",
        "flare_prompt_tokens": "vllm:prompt_tokens",             # loggers.py: counter, prefill tokens processed
        "flare_generation_tokens": "vllm:generation_tokens",     # loggers.py: counter, tokens generated
        "flare_requests_finished": "vllm:request_success",       # loggers.py: counter per finished_reason
        # Per-request times (histograms, read as _sum and _count; no contract name: daemon/hosts/metrics.py
        # TIMINGS). loggers.py observes each finished request's FinishedRequestStats, which stats.py
        # (IterationStats.update_from_finished_request) computes as queued_time = scheduled_ts - queued_ts
        # (waiting for the scheduler) and prefill_time = first_token_ts - scheduled_ts (to the first token,
        # preemptions included)
        "flare_request_queue_seconds": "vllm:request_queue_time_seconds",
        "flare_request_prefill_seconds": "vllm:request_prefill_time_seconds",
    },
    # SGLang 0.5.23 (PyPI), python/sglang/srt/observability/metrics_collector.py. Not run here: its CPU
    # backend needs a build of sgl-kernel that PyPI does not carry (docs/engines.md)
    "sglang": {
        "flare_requests_active": "sglang:num_running_reqs",   # SchedulerMetricsCollector: gauge, running requests
        "flare_requests_pending": "sglang:num_queue_reqs",    # SchedulerMetricsCollector: gauge, waiting queue
        # TokenizerMetricsCollector.observe_one_finished_request, at each request's finish, from its
        # cached_tokens_details: device = the GPU radix cache; host = HiCache's host tier, only the tokens
        # init_load_back spliced onto the device (managers/schedule_batch.py, Req.materialized_host_hit_len:
        # "must not credit host/storage for a declined or dropped load-back, whose span was re-prefilled"),
        # so what prefill skipped; storage = HiCache's L3 store (not mapped: not the host tier). A child
        # appears on its first increment (LAZY_SPLITS); a request without details counts under "total"
        "flare_host_cache_reused_tokens": 'sglang:cached_tokens{cache_source="host"}',
        "flare_gpu_prefix_cache_reused_tokens": 'sglang:cached_tokens{cache_source="device"}',
        # what HiCache's L3 store (a file store, Mooncake, 3FS: outside the process) gave: not the host tier's
        # reuse, but found outside the engine, which a fresh incarnation's first request must not be
        "flare_external_cache_found_tokens": 'sglang:cached_tokens{cache_source="storage"}',
        # SchedulerMetricsCollector, declared only with --enable-hierarchical-cache: gauges, in tokens
        "flare_host_cache_tokens_used": "sglang:hicache_host_used_tokens",
        "flare_host_cache_tokens_capacity": "sglang:hicache_host_total_tokens",
        # TokenizerMetricsCollector: counters per finished request, labelled is_streaming (summed); the
        # prompt count is the request's whole prompt, cached tokens included, as the contract's is
        "flare_prompt_tokens": "sglang:prompt_tokens",
        "flare_generation_tokens": "sglang:generation_tokens",
        # the same method's num_requests_total: one per request that finished, for whatever reason (the
        # TokenizerManager calls it for every finished state, aborts too, as vLLM's request_success counts its
        # abort reason), labelled is_streaming (summed): the contract's requests finished (0.5.23's wheel read)
        "flare_requests_finished": "sglang:num_requests",
        # SchedulerMetricsCollector's histogram: one sample per request, the wait before its first forward
        # (observability/req_time_stats.py, set_forward_entry_time: ts - wait_queue_entry_time), as vLLM's
        # queued_time. No prefill histogram of one sample a request (per_stage_req_latency_seconds is per slice)
        "flare_request_queue_seconds": "sglang:queue_time_seconds",
    },
}


# The counters whose sum, around one request at C1, the engine's own `usage.prompt_tokens_details.
# cached_tokens` must equal: vLLM's PromptTokenStats (vllm/v1/metrics/stats.py) keeps local_cache_hit +
# external_kv_transfer = the request's cached tokens; llama-server's prompt_tokens_cached counts the
# tokens its slot or prompt cache supplied, which its `cached_tokens` reports (tests/test_peer_llamacpp.py
# shows them equal). A phase in which they disagree is invalid (policies/phases.py). Flare's
# contract and SGLang's docs state no such identity: nothing is checked there.
REUSE_IDENTITY: dict[str, list[str]] = {
    # external_kv_transfer is part of cached_tokens but unmapped (above): the identity holds only on an
    # engine with no host tier, where it is 0 by configuration (daemon/window/setup.py, reuse_identity)
    "vllm": ["gpu_reused_tokens", "host_reused_tokens"],
    "llamacpp": ["host_reused_tokens"],
}


class StartupRequests(NamedTuple):
    """The generations an engine sends itself as it starts, which its own counters count: a fresh incarnation's
    counters may show these and nothing else (policies/rules.py, `startup_only`)."""

    at_most: int         # requests
    generated_each: int  # generated tokens each, at most


# SGLang 0.5.23 (PyPI wheel), entrypoints/http_server.py `_execute_server_warmup`: unless launched with
# --skip-server-warmup, it sends itself one /generate as it starts ("The capital city of France is", one text
# per data-parallel rank; or, for a vision model, an image and "Describe the image." on /v1/chat/completions),
# max_new_tokens 8 either way, and leaves `log_metrics` at its default, True (managers/io_struct.py), so
# TokenizerMetricsCollector counts it (managers/tokenizer_manager.py: `if self.enable_metrics and
# state.obj.log_metrics`): num_requests, prompt_tokens, generation_tokens and the queue-time histogram move
# before the window sends anything. Its /health generations set log_metrics=False and are not counted. Up to 16
# data-parallel ranks are allowed for. vLLM and llama-server count nothing of their own start-up (their real
# servers' fresh counters read zero in this suite).
STARTUP_REQUESTS: dict[str, StartupRequests] = {"sglang": StartupRequests(at_most=16, generated_each=8)}


# Engines that refuse a body naming a model they do not serve: vLLM answers 404
# (tests/data/metrics/vllm-0.32.0/wrong-model.json); llama-server answers whatever the body names.
REFUSES_UNSERVED_MODEL = frozenset({"vllm"})

# Engines that stream `usage` only when the body asks for it (`"stream_options": {"include_usage": true}`), where
# contract section 1's Flare host carries it in every stream's last chunk: vLLM 0.32.0 (`should_include_usage` in
# vllm/entrypoints/serve/utils/api_utils.py: the body's stream_options.include_usage, or the server's
# --enable-force-include-usage), SGLang (`should_include_usage` in python/sglang/srt/entrypoints/openai/utils.py:
# the body's, or the server's default), llama-server (slot.params.include_usage from the body's stream_options,
# default false; measured on the 0.3.36 build, tests/test_peer_llamacpp.py). A window reads each answer's token
# counts from its usage, so a body that does not ask fails every request it is sent as.
USAGE_ONLY_WHEN_ASKED = frozenset({"vllm", "sglang", "llamacpp"})
# the server flag that makes an engine send usage whether or not the body asks (a site's local recipe may carry it)
FORCES_USAGE = {"vllm": "--enable-force-include-usage"}

# The server flag without which an engine leaves `prompt_tokens_details` (cached_tokens) out of every answer's
# usage: vLLM 0.32.0's _make_prompt_tokens_details returns None unless the server runs with
# --enable-prompt-tokens-details (vllm/entrypoints/openai/chat_completion/serving.py)
REPORTS_CACHED_TOKENS_WITH = {"vllm": "--enable-prompt-tokens-details"}

# Engines whose streamed answer names the model that served it, the name their identity reports: vLLM's
# chat chunks carry `model=model_name`, `OpenAIServingModels.model_name()` (the first served model's name,
# a LoRA's for a LoRA request; vllm/entrypoints/openai/chat_completion/serving.py, models/serving.py), the
# same name `/v1/models` lists first (show_available_models), which is the identity's `model`
# (localengine.py). llama-server answers with whatever `model` the body names, SGLang (reached through the
# operator's adapter, never run here) is not known to say more, and Flare's contract gives the field no
# meaning: their answers witness nothing, and are not held to it.
ANSWER_NAMES_SERVED_MODEL = frozenset({"vllm"})


class LazySplit(NamedTuple):
    """A counter family split by a label whose children the engine creates on their first increment:
    while the family is declared as split, an absent child has counted nothing yet (0), not 'not
    observable'; once the fallback child appears, the split is not reported and no part is read."""

    label: str        # the label that splits the family
    declared_by: str  # words of the family's HELP that say the split exists (an older release's does not)
    fallback: str     # the child written for a request whose split is unknown


# SGLang 0.5.23's cached_tokens_total: labelnames + ["cache_source"], documented "Number of cached prompt
# tokens by source (device/host/storage)."; children by `.labels(cache_source=...).inc(v)` only for v > 0,
# and "total" when a request carries no cached_tokens_details (observe_one_finished_request). Releases
# before the split (HELP "Number of cached prompt tokens.") have no cache_source label at all.
LAZY_SPLITS: dict[str, LazySplit] = {"sglang:cached_tokens": LazySplit("cache_source", "by source", "total")}


def metric_names(profile: str, overrides: dict[str, str]) -> dict[str, str]:
    """The engine profile's map with the site's own [metrics] entries on top."""
    return {**PROFILES[profile], **overrides}
