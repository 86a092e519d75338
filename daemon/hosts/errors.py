"""Classifying failures of the outside world into the policy's error classes (see policies.rules)."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import msgspec

_log = logging.getLogger("flare_diag.runner")


class ActionFailed(Exception):
    def __init__(self, error: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail
        self.status = status  # the HTTP status the host answered, where it answered one


MESSAGE_CAP = 200  # characters of a refusal's message kept in the log


def _error_words(resp: httpx.Response) -> tuple[str | None, str]:
    """(type, message) of an error body: `{"error": {"type", "message"}}`, `{"error": "..."}` (vLLM's 401),
    or `{"object": "error", "message"}`; (None, "") for anything else."""
    try:
        body = resp.json()
    except Exception:
        return None, ""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, str):
        return None, err
    node = err if isinstance(err, dict) else body if isinstance(body, dict) else {}
    etype, msg = node.get("type"), node.get("message")
    return (etype if isinstance(etype, str) else None), (" ".join(msg.split())[:MESSAGE_CAP] if isinstance(msg, str) else "")


def classify_response(resp: httpx.Response, what: str) -> ActionFailed:
    etype, msg = _error_words(resp)
    status = resp.status_code
    if status == 401:
        return ActionFailed("authentication", f"{what}: 401 unauthorized", status)
    if etype in ("cuda_error", "out_of_memory"):
        return ActionFailed(etype, f"{what}: {status} {etype}", status)
    if status == 404 and what.startswith(("router", "monitoring")):
        return ActionFailed("not_found", f"{what}: 404", status)
    said = f": {msg}" if msg and 400 <= status < 500 else ""  # a refusal says why; the caller scrubs secrets
    return ActionFailed(f"http_{status}", f"{what}: HTTP {status} {etype or ''}".strip() + said, status)


MALFORMED = (json.JSONDecodeError, msgspec.DecodeError, UnicodeDecodeError, httpx.DecodingError)
MAX_ANSWER_BYTES = 64 << 20  # a host answer larger than this is not one this daemon reads


def answer_json(resp: httpx.Response, what: str) -> object:
    """A host's JSON answer, decoded; a body too large, not JSON or nested deeper than the decoder
    goes (a hostile host's `[[[[...`) is the host's malformed answer, never this daemon's error."""
    if len(resp.content) > MAX_ANSWER_BYTES:
        raise ActionFailed("malformed_transport", f"{what}: an answer of {len(resp.content)} bytes "
                                                  f"(at most {MAX_ANSWER_BYTES} are read)")
    try:
        return msgspec.json.decode(resp.content)
    except msgspec.DecodeError:
        raise ActionFailed("malformed_transport", f"{what}: the answer is not JSON") from None
    except RecursionError:
        raise ActionFailed("malformed_transport", f"{what}: the answer's JSON is nested too deep to read") from None


def answer_object(resp: httpx.Response, what: str) -> dict[str, Any]:
    """A host's answer that must be a JSON object; any other JSON is the host's malformed answer."""
    return json_object(answer_json(resp, what), what)


def json_object(doc: object, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ActionFailed("malformed_transport", f"{what}: the answer is a JSON {type(doc).__name__}, not an object")
    return doc


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


# the transport failures where nothing accepted a connection, as `classify_exception` names them in a detail
NO_CONNECTION = (httpx.ConnectError.__name__, httpx.ConnectTimeout.__name__)


def no_connection_made(f: ActionFailed) -> bool:
    """Whether a transport failure is one where no connection was accepted (a service unreachable), not one
    accepted and then closed or held without an answer."""
    return f.error == "transport" and f.detail.rsplit(": ", 1)[-1] in NO_CONNECTION


def why_unread(exc: BaseException, what: str) -> str:
    """Why a read got no answer, in a report's words: "no connection" when nothing accepted one (the
    process behind the port is gone, or was never there), "timeout", else the failure's class."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "no connection"
    return classify_exception(exc, what).error
