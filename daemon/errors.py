"""Classifying failures of the outside world into the policy's error classes (see policies.rules)."""

from __future__ import annotations

import httpx


class ActionFailed(Exception):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


def classify_response(resp: httpx.Response, what: str) -> ActionFailed:
    etype = None
    try:
        etype = resp.json().get("error", {}).get("type")
    except Exception:
        pass
    if resp.status_code == 401:
        return ActionFailed("authentication", f"{what}: 401 unauthorized")
    if etype in ("cuda_error", "out_of_memory"):
        return ActionFailed(etype, f"{what}: {resp.status_code} {etype}")
    if resp.status_code == 404 and what.startswith(("router", "monitoring")):
        return ActionFailed("not_found", f"{what}: 404")
    return ActionFailed(f"http_{resp.status_code}", f"{what}: HTTP {resp.status_code} {etype or ''}".strip())


def classify_exception(exc: BaseException, what: str) -> ActionFailed:
    if isinstance(exc, ActionFailed):
        return exc
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return ActionFailed("malformed_transport", f"{what}: malformed answer ({type(exc).__name__})")
    if isinstance(exc, httpx.TransportError):
        return ActionFailed("transport", f"{what}: {type(exc).__name__}")
    return ActionFailed("internal", f"{what}: {type(exc).__name__}")
