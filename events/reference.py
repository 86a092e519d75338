"""The event reference (docs/events.md), rendered from the registered types themselves, so that what an
auditor reads of each event's meaning, fields and defaults cannot drift from what the log holds.

`python -m flare_diag.events.reference > docs/events.md` writes it; tests/test_docs.py holds the file
equal to this rendering.
"""

from __future__ import annotations

import inspect
import re
import sys

import msgspec

from flare_diag.events import schema
from flare_diag.events.actions import ACTION_TYPES, action_tag
from flare_diag.events.base import Event, known_tags, registered_type
from flare_diag.events.schema import Decision, Input

_FIELD = re.compile(r"^\s{4}(\w+)\s*:\s*[^=#]+?(?:=\s*[^#]+?)?\s*(?:#\s*(.*))?$")

HEAD = """# Event reference

Every event type the log holds, with its fields as stored in the `payload` column (JSON, as hashed):
the field's type, its default when an older or shorter event leaves it out, and what the schema's
source says of it. The envelope (seq, clocks, `window_id`, `causation_seq`, the chain) is in
docs/event-log.md; schema versions and upcasting are under "Schema evolution" there.

This file is generated from events/schema.py and events/actions.py by
`python -m flare_diag.events.reference > docs/events.md`; tests/test_docs.py holds it equal to them.

- **Inputs** are what the window policy receives. Each is appended before the policy sees it, and
  `at_ns` is the window clock: nanoseconds since the window opened, times a rehearsal's time scale.
- **Decisions** are what the policy decides. Each is appended before it is carried out; `log audit`
  replays the inputs through the policy and compares its decisions with these.
- **Records** are neither: notes, archives, probes, control commands. The policy never reads them.
"""


def _notes(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source. A comment above a run of fields is the first one's
    note, and the others point to it; a comment beside a field is that field's own."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    notes: dict[str, str] = {}
    above: list[str] = []
    group: str | None = None  # the field whose note the comment above a run of fields became
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("#").strip())
            group = None
            continue
        m = _FIELD.match(line)
        if not m or text.startswith(("def ", "@", "return")):
            above, group = [], None
            continue
        own = m.group(2) or ""
        if above:
            notes[m.group(1)] = " ".join([*above, own]).strip()
            group, above = m.group(1), []
        elif group is not None:
            notes[m.group(1)] = " ".join([own, f"(with `{group}`)"]).strip()
        else:
            notes[m.group(1)] = own
    return notes


def _annotation(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        ann = klass.__dict__.get("__annotations__", {})
        if name in ann:
            return str(ann[name]).replace("typing.", "")
    return "?"


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.default is not msgspec.NODEFAULT:
        return f"`{msgspec.json.encode(f.default).decode()}`"
    if f.default_factory is not msgspec.NODEFAULT:
        return f"`{msgspec.json.encode(f.default_factory()).decode()}`"
    return "required"


def _fields_table(cls: type) -> list[str]:
    fields = msgspec.structs.fields(cls)
    if not fields:
        return ["No fields."]
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if isinstance(klass, type) and issubclass(klass, msgspec.Struct) and "__annotations__" in klass.__dict__:
            notes.update(_notes(klass))
    rows = ["| field | type | default | note |", "|---|---|---|---|"]
    for f in fields:
        note = notes.get(f.name, "").replace("|", "\\|")
        kind = _annotation(cls, f.name).replace("|", "\\|")  # a table's cell ends at a bare pipe, in code too (GFM)
        rows.append(f"| `{f.encode_name}` | `{kind}` | {_default(f)} | {note} |")
    return rows


def _doc(cls: type) -> str:
    return " ".join(inspect.cleandoc(cls.__dict__.get("__doc__") or "").split())


def _section(cls: type, tag: str, version: int | None = None) -> list[str]:
    title = f"### `{tag}`" + (f" (schema v{version})" if version is not None else "")
    return [title, "", _doc(cls), "", *_fields_table(cls), ""]


def render() -> str:
    """docs/events.md as this build's schema makes it."""
    kinds: dict[str, list[tuple[str, type[Event], int]]] = {"Inputs": [], "Decisions": [], "Records": []}
    for tag, version in _schema_tags().items():
        cls = registered_type(tag)
        kind = "Inputs" if issubclass(cls, Input) else "Decisions" if issubclass(cls, Decision) else "Records"
        kinds[kind].append((tag, cls, version))
    out = [HEAD]
    for kind, events in kinds.items():
        out += [f"## {kind}", ""]
        for tag, cls, version in events:
            out += _section(cls, tag, version)
    out += ["## Actions", "",
            "What an `action_requested` decision's `request` holds: one of these, its `action` field naming it.",
            "Fields left at their defaults are not written (`omit_defaults`).", ""]
    for action in ACTION_TYPES:
        out += _section(action, action_tag(action))
    return "\n".join(out).rstrip("\n") + "\n"


def _schema_tags() -> dict[str, int]:
    """The tags events/schema.py registers, with their versions (a test may register types of its own)."""
    return {tag: v for tag, v in known_tags().items() if registered_type(tag).__module__ == schema.__name__}



def undocumented() -> list[str]:
    """Event and action types without a docstring of their own: the reference would say nothing of them."""
    types_: list[type] = [registered_type(t) for t in _schema_tags()] + list(ACTION_TYPES)
    return [cls.__name__ for cls in types_ if not _doc(cls)]


if __name__ == "__main__":
    sys.stdout.write(render())
