"""The machine-checked shape of `report.json` (contract section 4, schema flare-diag.report/1)."""

from __future__ import annotations

from typing import Literal

import msgspec

Status = Literal["measured", "failed", "invalid", "deferred"]
# the last two: a plan whose order probe reads the GPU prefix cache (`[verdict] tier = "gpu_prefix"`)
Hypothesis = Literal["not_reproduced", "row_checkpoint_churn", "restore_path", "key_or_checkpoint_eligibility",
                     "inconclusive", "prefix_cache_churn", "no_prefix_reuse"]
# contract section 4's reasons (engine_restart and rejected since its 2026-12-03 amendment), and the
# departures' (docs/departures.md: engine_lost, engine_stalled, store_failure, preflight, steady_state, unexpected_input,
# not_as_sent);
# policies.rules.ABORT_REASONS is the same list (tests/test_reports.py holds them equal)
AbortReason = Literal["identity_drift", "authentication", "malformed_transport", "gpu_fault", "containment",
                      "uncontrolled_growth", "watch_lost", "engine_lost", "engine_stalled", "operator", "daemon_restart",
                      "store_failure", "preflight", "steady_state", "engine_restart", "rejected", "unexpected_input",
                      "not_as_sent"]


class _S(msgspec.Struct, forbid_unknown_fields=False):
    """Contract fields are required; more fields are welcome (the contract says so)."""


class Abort(_S):
    reason: AbortReason
    detail: str
    minute: float | None


class Host(_S):
    lookups: int | None
    hits: int | None
    fetched_tokens: int | None
    reused_tokens: int | None


class Gpu(_S):
    hits: int | None
    reused_tokens: int | None


class Cell(_S):
    phase: str
    status: Status
    reason: str
    requests: int
    host: Host | None
    gpu: Gpu | None
    comparable: bool


class Verdict(_S):
    hypothesis: Hypothesis
    basis: str
    next_experiment: str


class Restoration(_S):
    started_minute: float | None
    finished_minute: float | None
    incumbent_sha256_match: bool
    containment: bool | None            # None: no router and no GPU to contain (a CPU peer engine)
    monitoring_registered: bool | None  # None: the site has no monitoring (not applicable)
    direct_preflight: bool
    routed_preflight: bool | None       # None: the site has no router
    readmitted: bool | None
    verified: bool


class Integrity(_S):
    events: int
    head_seq: int
    head_hash: str
    chain_ok: bool
    audit_ok: bool  # this window's decisions replayed equal, and none of the log's differs under its own policy
    problem: str | None = None        # why the chain does not verify
    audit_problem: str | None = None  # the first decision that differs under the policy that made it
    audit_policy: str | None = None   # this window was decided by another policy version: not replayed here


class Report(_S):
    schema: Literal["flare-diag.report/1"]
    window_id: str
    plan: str | None
    t0_wall: int | None
    outcome: Literal["completed", "partial", "aborted", "restore_failed"] | None  # None: the window is still open
    abort: Abort | None
    cells: list[Cell]
    verdict: Verdict | None
    restoration: Restoration | None
    integrity: Integrity


def validate(data: bytes) -> Report:
    """Decodes report.json against the contract's shape; raises msgspec.ValidationError naming the field."""
    return msgspec.json.decode(data, type=Report)
