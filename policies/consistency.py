"""Output consistency: whether a greedy body's answer given with the host's reuse equals its cold one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    """One answer as the consistency rule reads it."""

    body_index: int
    output_sha256: str  # "" where the answer's text was not read
    cached_tokens: int | None  # the engine's own count of prompt tokens it did not recompute
    host_reused_tokens: int | float | None  # the host counter's delta across this request (C1)


def reused(cold: Answer, warm: Answer) -> bool | None:
    """Whether the warm answer was given with more reuse than the cold one, by the host's counter when
    it moved, else by the engine's cached_tokens (an engine with only a prefix cache); None when neither
    says (no counter moved, and the answer's usage has no cached_tokens: vLLM without
    --enable-prompt-tokens-details), which is not 'no reuse'."""
    if warm.host_reused_tokens:
        return True
    if warm.cached_tokens is None:
        return None
    return warm.cached_tokens > (cold.cached_tokens or 0)


def judge(cold: list[Answer], warm: list[Answer]) -> dict[str, Any]:
    """The phase's finding from its two passes, body by body: which bodies were compared, which were
    answered with reuse on the warm pass (and on how many that could not be told), and which answered
    differently."""
    by_body = {a.body_index: a for a in cold}
    compared = differ_n = reused_n = untold = 0
    differ = []
    unread = []
    for w in warm:
        c = by_body.get(w.body_index)
        if c is None:
            continue
        if not (c.output_sha256 and w.output_sha256):
            unread.append(w.body_index)
            continue
        compared += 1
        r = reused(c, w)
        reused_n += r is True
        untold += r is None
        if c.output_sha256 != w.output_sha256:
            differ_n += 1
            differ.append({"body_index": w.body_index, "cold_sha256": c.output_sha256, "warm_sha256": w.output_sha256,
                           "reused": r})
    out = {"bodies": len(by_body), "compared": compared, "reused_warm": reused_n, "differ": differ,
           "unread": unread, "consistent": compared > 0 and differ_n == 0}
    return {**out, "reuse_untold": untold} if untold else out  # the key only where it says something


def finding(result: dict[str, Any]) -> tuple[str, str]:
    """(the cell's status, its reason) for a consistency phase that ran all its requests."""
    n, differ = result["compared"], result["differ"]
    if n == 0:
        return "invalid", "no answer's text could be compared (the engine's stream carried no content)"
    if differ:
        shown = ", ".join(f"#{d['body_index']}" for d in differ[:5]) + (" ..." if len(differ) > 5 else "")
        return "measured", (f"INCONSISTENT: {len(differ)} of {n} greedy bodies answered differently with reuse than "
                            f"cold ({shown}): cached state changed answers")
    if result["reused_warm"] == 0 and result.get("reuse_untold"):
        return "invalid", (f"{n} greedy bodies answered alike, but whether the warm pass reused anything is not "
                           f"observable for {result['reuse_untold']} of them (their usage carries no cached_tokens and "
                           f"no host counter moved), so reuse was not shown to be put to the test")
    if result["reused_warm"] == 0:
        return "invalid", (f"{n} greedy bodies answered alike, but the warm pass reused nothing, so reuse was never "
                           f"put to the test")
    return "measured", (f"consistent: {n} of {n} greedy bodies answered alike cold and with reuse "
                        f"({result['reused_warm']} of them with reuse)")
