"""The error shapes a chat-completion stream can carry mid-answer, read into one failure of the request.

Engines end a stream that failed after HTTP 200 in several ways: vLLM writes `data: {"error": {...}}`
(`vllm/entrypoints/openai/serving_chat.py`, `chat_completion_stream_generator`: the `ErrorResponse`
model dumped into the stream) and its older releases a bare `{"object": "error", "message": ...}`; a
proxy or a hand-written host may put a string there, nest it, or send an SSE `event: error`. Each is
a failed request with the host's own words (bounded), never a chunk read as if it were an answer.
"""

from __future__ import annotations

from flare_diag.daemon.hosts.errors import ActionFailed

MESSAGE_CAP = 300  # characters of the host's message kept: enough to name the fault, never a whole page
GPU_ERRORS = ("cuda_error", "out_of_memory")


def _words(node: object, depth: int = 0) -> tuple[str | None, str]:
    """(type, message) from an error value: a string, an object with type/message, or one nested deeper."""
    if isinstance(node, str):
        return None, node
    if isinstance(node, dict) and depth < 4:
        inner = node.get("error")
        if isinstance(inner, (dict, str)) and not node.get("message"):
            return _words(inner, depth + 1)
        etype = node.get("type") if isinstance(node.get("type"), str) else None
        msg = node.get("message")
        return etype, msg if isinstance(msg, str) else str({k: v for k, v in node.items() if k != "type"} or "")
    return None, str(node)


def stream_error(chunk: object, event: str | None = None) -> ActionFailed | None:
    """The failure a stream's event carries, or None when it is an ordinary chunk."""
    if event == "error":
        etype, msg = _words(chunk)
    elif not isinstance(chunk, dict):
        return ActionFailed("malformed_transport", f"chat completion: a stream event is {type(chunk).__name__}, "
                                                   f"not a chunk object")
    elif "error" in chunk:
        etype, msg = _words(chunk["error"]) if chunk["error"] is not None else (None, "")
    elif chunk.get("object") == "error":
        etype, msg = _words(chunk)
    else:
        return None
    msg = " ".join(str(msg).split())[:MESSAGE_CAP]
    etype = " ".join(etype.split())[:60] if etype else None
    error = etype if etype in GPU_ERRORS else "engine_error"
    return ActionFailed(error, f"chat completion: stream error{f' {etype}' if etype else ''}" + (f": {msg}" if msg else ""))
