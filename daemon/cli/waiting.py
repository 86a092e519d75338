"""The actions a window waits on, in the words `status` and `watch` print."""

from __future__ import annotations


def waiting_words(waiting: list[dict], minute: float | None, shown: int = 3) -> str:
    """The actions the window has asked for and not had answered, the oldest first: '#88 load (asked at
    minute 71.2, 1.7 min ago; deadline 600 s)'."""
    def one(a: dict) -> str:
        since = a.get("since_minute")
        asked = "asked before minute 0" if since is None else f"asked at minute {since:g}"
        if since is not None and minute is not None and minute > since:
            asked += f", {minute - since:.1f} min ago"
        deadline = f"; deadline {a['deadline_s']:g} s" if a.get("deadline_s") else ""
        cancelled = "; its cancel asked" if a.get("cancelled") else ""
        return f"#{a['action_id']} {a['action']} ({asked}{deadline}{cancelled})"
    words = "; ".join(one(a) for a in waiting[:shown])
    return words + (f"; and {len(waiting) - shown} more" if len(waiting) > shown else "")
