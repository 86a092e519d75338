"""Replay fixtures (contract section 2): read, verified against the manifest before any window starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec
from flare_diag.resources import resource

BUILTIN = resource("flare_diag.fixtures", "data")


class FixtureError(ValueError):
    pass


class Fixture(msgspec.Struct):
    name: str
    bodies: list[bytes]
    sha256: list[str]
    sampling: dict
    prompt_tokens: list[int] | None = None  # optional in the manifest: the host tokenizer's count per body

    def work(self) -> dict:
        """What each body asks of the engine, for the planner: max_tokens, prompt size, hash."""
        max_tokens, chars = [], []
        for b in self.bodies:
            try:
                d = json.loads(b)
            except ValueError:
                d = {}
            d = d if isinstance(d, dict) else {}
            max_tokens.append(int(d.get("max_tokens") or d.get("max_completion_tokens") or self.sampling.get("max_tokens") or 0))
            chars.append(sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(json.dumps(m.get("content")))
                             for m in d.get("messages") or [] if isinstance(m, dict)))
        return {"count": len(self.bodies), "sha256": self.sha256, "max_tokens": max_tokens, "prompt_chars": chars,
                "prompt_tokens": self.prompt_tokens}


def find_fixture(name: str, search: list[Path]) -> Path:
    for base in [*search, BUILTIN]:
        p = base / name
        if (p / "manifest.json").is_file():
            return p
        if p.is_dir():  # the operator's own folder of that name: never silently replaced by a built-in one
            raise FixtureError(f"fixture {name!r}: {p} has no manifest.json")
    raise FixtureError(f"fixture {name!r}: not found in {', '.join(str(s) for s in [*search, BUILTIN])}")


def load_fixture(path: Path) -> Fixture:
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        raw = (path / "bodies.jsonl").read_bytes()
    except (OSError, ValueError, RecursionError) as exc:
        raise FixtureError(f"{path}: unreadable fixture ({exc})") from None
    if not isinstance(manifest, dict):
        raise FixtureError(f"{path}: manifest.json: expected a JSON object, found {type(manifest).__name__}")
    if not isinstance(manifest.get("sha256", []), list) or not isinstance(manifest.get("sampling", {}), dict) \
            or not isinstance(manifest.get("name", ""), str):
        raise FixtureError(f"{path}: manifest.json: expected `sha256` a list, `sampling` an object, `name` a string")
    bodies = [line for line in raw.split(b"\n") if line]
    shas = [hashlib.sha256(b).hexdigest() for b in bodies]
    if manifest.get("count") != len(bodies):
        raise FixtureError(f"{path}: manifest count {manifest.get('count')} but bodies.jsonl has {len(bodies)} bodies")
    for i, (want, got) in enumerate(zip(manifest.get("sha256", []), shas)):
        if want != got:
            raise FixtureError(f"{path}: body {i} sha256 {got[:12]}… does not match the manifest's {str(want)[:12]}…")
    if len(manifest.get("sha256", [])) != len(bodies):
        raise FixtureError(f"{path}: manifest lists {len(manifest.get('sha256', []))} hashes for {len(bodies)} bodies")
    pt = manifest.get("prompt_tokens")
    if pt is not None and (not isinstance(pt, list) or len(pt) != len(bodies)
                           or not all(isinstance(x, int) and x >= 0 for x in pt)):
        raise FixtureError(f"{path}: manifest prompt_tokens: expected one whole number per body ({len(bodies)})")
    return Fixture(manifest.get("name", path.name), bodies, shas, manifest.get("sampling", {}), pt)
