"""Replay fixtures (contract section 2): read, verified against the manifest before any window starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.files import FileRefused, read_bounded
from flare_diag.resources import resource

BUILTIN = resource("flare_diag.fixtures", "data")


MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists a hash per body
MAX_BODIES_BYTES = 1 << 30  # the retained bodies of a window: tens of MB at most in practice


class FixtureError(ValueError):
    pass


# bodies are tens of KB of JSON, read at every start (the planner's work, the sampling check):
# msgspec's decoder, not the standard library's
_decode = msgspec.json.Decoder().decode


class Fixture(msgspec.Struct):
    name: str
    bodies: list[bytes]
    sha256: list[str]
    sampling: dict
    prompt_tokens: list[int] | None = None  # optional in the manifest: the host tokenizer's count per body
    manifest_sha256: str = ""  # of manifest.json's bytes: what a review covers (it lists every body's hash)

    def unasked_usage(self) -> int | None:
        """The first streamed body that does not ask for usage (`stream_options.include_usage` true), or None."""
        for i, b in enumerate(self.bodies):
            try:
                d = _decode(b)
            except msgspec.DecodeError:
                continue
            if not isinstance(d, dict) or d.get("stream") is not True:
                continue
            opts = d.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage") is True):
                return i
        return None

    def models(self) -> list[str]:
        """The distinct models the bodies name, in the order first named."""
        seen: dict[str, None] = {}
        for b in self.bodies:
            try:
                d = _decode(b)
            except msgspec.DecodeError:
                continue
            if isinstance(d, dict) and isinstance(d.get("model"), str):
                seen.setdefault(d["model"], None)
        return list(seen)

    def work(self) -> dict:
        """What each body asks of the engine, for the planner: max_tokens, prompt size, hash."""
        max_tokens, chars = [], []
        for b in self.bodies:
            try:
                d = _decode(b)
            except msgspec.DecodeError:
                d = {}
            d = d if isinstance(d, dict) else {}
            max_tokens.append(int(d.get("max_tokens") or d.get("max_completion_tokens") or self.sampling.get("max_tokens") or 0))
            chars.append(sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(json.dumps(m.get("content")))
                             for m in d.get("messages") or [] if isinstance(m, dict)))
        return {"count": len(self.bodies), "sha256": self.sha256, "max_tokens": max_tokens, "prompt_chars": chars,
                "prompt_tokens": self.prompt_tokens}


# the sampling fields a body, the plan and the manifest must agree on (contract section 2, amended
# 2026-12-01); reasoning effort "omitted" in a plan means the bodies carry none (an engine without it)
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "reasoning_effort", "stream")
OMITTED = "omitted"


def _same(a: object, b: object) -> bool:
    """Equal as sampling values: 1 and 1.0 are the same temperature; True is not the number 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def sampling_mismatch(fx: Fixture, want: dict) -> str | None:
    """The first body whose sampling differs from `want` (the plan's, for this fixture) or from the
    manifest's, as 'body N (sha256 …): field = X, the plan's [sampling] says Y', or None."""
    manifest = fx.sampling or {}
    for f in SAMPLING_FIELDS:
        if f in manifest and f in want and not _same(manifest[f], want[f]) and not (f == "reasoning_effort" and want[f] == OMITTED):
            return f"manifest sampling.{f} = {manifest[f]!r}, the plan's [sampling] says {want[f]!r}"
    for i, raw in enumerate(fx.bodies):
        try:
            body = _decode(raw)
        except msgspec.DecodeError:
            return f"body {i} (sha256 {fx.sha256[i][:12]}): not a JSON object"
        if not isinstance(body, dict):
            return f"body {i} (sha256 {fx.sha256[i][:12]}): not a JSON object"
        for f in SAMPLING_FIELDS:
            got = body.get(f, body.get("max_completion_tokens") if f == "max_tokens" else None)
            if f == "reasoning_effort" and want.get(f) == OMITTED:
                if got is not None:
                    return f"body {i} (sha256 {fx.sha256[i][:12]}): {f} = {got!r}, the plan's [sampling] says none"
                continue
            for label, ref in (("the plan's [sampling]", want), ("its manifest", manifest)):
                if f in ref and not _same(got, ref[f]):
                    return f"body {i} (sha256 {fx.sha256[i][:12]}): {f} = {got!r}, {label} says {ref[f]!r}"
    return None


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
        manifest_bytes = read_bounded(path / "manifest.json", "the fixture's manifest", MAX_MANIFEST_BYTES)
        manifest = json.loads(manifest_bytes)
        raw = read_bounded(path / "bodies.jsonl", "the fixture's bodies", MAX_BODIES_BYTES)
    except FileRefused as exc:
        raise FixtureError(str(exc)) from None
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
    for i, body in enumerate(bodies):  # every later reader decodes them: a body none can read is refused here
        why = _not_an_object(body)
        if why:
            raise FixtureError(f"{path}: body {i} (sha256 {shas[i][:12]}…): {why}")
    pt = manifest.get("prompt_tokens")
    if pt is not None and (not isinstance(pt, list) or len(pt) != len(bodies)
                           or not all(isinstance(x, int) and x >= 0 for x in pt)):
        raise FixtureError(f"{path}: manifest prompt_tokens: expected one whole number per body ({len(bodies)})")
    return Fixture(manifest.get("name", path.name), bodies, shas, manifest.get("sampling", {}), pt,
                   hashlib.sha256(manifest_bytes).hexdigest())


GREEDY_SEED = 20261022  # sent to engines that take a seed; greedy decoding should not need it


def _not_an_object(raw: bytes) -> str | None:
    """Why a body is not a request body (contract section 2: a JSON object), or None."""
    try:
        body = msgspec.json.decode(raw)
    except RecursionError:
        return "its JSON is nested deeper than a decoder reads"
    except msgspec.DecodeError:
        return "not valid JSON"
    if not isinstance(body, dict):
        return "not a JSON object"
    n = body.get("n", 1)
    if type(n) is not int or n != 1:
        # one body, one completion: the stream is read as one answer, and the engine's counters are held to
        # the requests the window sent (a body asking n completions is n requests to vLLM's scheduler). The
        # type too: true and 1.0 equal 1 in Python, and what an engine makes of them is its own reading
        return f"n = {msgspec.json.encode(n).decode()}: a window replays one completion a body (n = 1 or no n)"
    return None


def greedy_variant(fx: Fixture, name: str, max_tokens: int) -> Fixture:
    """The fixture's bodies made greedy (temperature 0, a fixed seed) with at most `max_tokens` each:
    the same messages, so the same prompts and the same host reuse, and answers that must not vary."""
    bodies = []
    for i, raw in enumerate(fx.bodies):
        try:
            body = json.loads(raw)
        except ValueError:
            raise FixtureError(f"fixture {fx.name}: body {i} is not JSON") from None
        body["temperature"] = 0
        body["seed"] = GREEDY_SEED
        for key in ("max_tokens", "max_completion_tokens"):
            if key in body:
                body[key] = min(int(body[key]), max_tokens)
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = max_tokens
        bodies.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    sampling = {**fx.sampling, "temperature": 0, "max_tokens": min(int(fx.sampling.get("max_tokens") or max_tokens), max_tokens)}
    return Fixture(name, bodies, [hashlib.sha256(b).hexdigest() for b in bodies], sampling, fx.prompt_tokens)


def write_fixture(folder: Path, fx: Fixture, derived_from: dict | None = None) -> Path:
    """Writes `fx` as a fixture folder `folder/fx.name` (bodies.jsonl and its manifest); never over
    another: a folder already holding these very bodies is kept as it is."""
    d = folder / fx.name
    if d.exists():
        try:
            same = load_fixture(d).sha256 == fx.sha256
        except FixtureError:
            same = False
        if same:
            return d
        raise FixtureError(f"{d}: already exists with other bodies; a fixture is never overwritten")
    d.mkdir(parents=True)
    (d / "bodies.jsonl").write_bytes(b"".join(b + b"\n" for b in fx.bodies))
    manifest: dict = {"name": fx.name, "count": len(fx.bodies), "sha256": fx.sha256, "sampling": fx.sampling}
    if fx.prompt_tokens is not None:
        manifest["prompt_tokens"] = fx.prompt_tokens
    if derived_from:
        manifest["derived_from"] = derived_from
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return d
