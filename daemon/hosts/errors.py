"""Classifying failures of the outside world into the policy's error classes (see policies.rules)."""

from __future__ import annotations

import json
import logging

import httpx
import msgspec

_log = logging.getLogger("flare_diag.runner")


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


MALFORMED = (json.JSONDecodeError, msgspec.DecodeError, UnicodeDecodeError, httpx.DecodingError)


def classify_exception(exc: BaseException, what: str) -> ActionFailed:
    """Only the target's answers and the transport are the host's fault; anything else raised while
    carrying out an action is this daemon's own bug (`internal_error`), logged with its traceback."""
    if isinstance(exc, ActionFailed):
        return exc
    if isinstance(exc, MALFORMED):
        return ActionFailed("malformed_transport", f"{what}: malformed answer ({type(exc).__name__})")
    if isinstance(exc, httpx.TransportError):
        return ActionFailed("transport", f"{what}: {type(exc).__name__}")
    _log.error("internal error while carrying out %s", what, exc_info=exc)
    return ActionFailed("internal_error", f"{what}: internal error ({type(exc).__name__}), not the host's fault")
