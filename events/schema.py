"""Every event type the log knows, as one msgspec tagged union (importing this registers them all)."""

from __future__ import annotations

from events.base import Event, register


@register
class LogNote(Event, tag="log_note"):
    """A free-form operator or tool note; carries no decision weight."""

    text: str
    source: str = ""
