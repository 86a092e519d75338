"""Whether the engine would accept each fixture body, judged by its own `/openapi.json` request schema."""

from __future__ import annotations

import jsonschema
import msgspec
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from flare_diag.daemon.hosts.fixture import Fixture

CHAT_PATH = "/v1/chat/completions"
ROOT_URI = "urn:flare-diag:openapi"


class SchemaUnusable(ValueError):
    """The document names no JSON request schema for the chat route (or is not an OpenAPI document)."""


def chat_validator(openapi: object) -> jsonschema.protocols.Validator:
    """A validator for the chat route's JSON request body, its `$ref`s resolved inside the document
    (FastAPI writes OpenAPI 3.1, whose schemas are JSON Schema 2020-12: vLLM's and SGLang's servers)."""
    try:
        body = openapi["paths"][CHAT_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]  # type: ignore[index]  # the engine's OpenAPI document, read as JSON
    except (KeyError, TypeError):
        raise SchemaUnusable(f"no JSON request schema for POST {CHAT_PATH}") from None
    registry = Registry().with_resource(ROOT_URI, Resource.from_contents(openapi, default_specification=DRAFT202012))
    ref = body.get("$ref") if isinstance(body, dict) else None
    schema = {"$ref": ROOT_URI + ref} if isinstance(ref, str) and ref.startswith("#") else body
    try:
        return jsonschema.Draft202012Validator(schema, registry=registry)
    except jsonschema.SchemaError as exc:  # noqa: B904 - its words, not its traceback
        raise SchemaUnusable(f"the request schema is not a JSON schema ({exc.message})") from None


def refusals(validator: jsonschema.protocols.Validator, fixtures: dict[str, Fixture]) -> list[str]:
    """One line per body the schema refuses: fixture, body index, its hash, the field and why."""
    out = []
    for name in sorted(fixtures):
        fx = fixtures[name]
        for i, raw in enumerate(fx.bodies):
            try:
                body = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                continue  # fixture load refuses a body that is not JSON; not this check's to say
            err = jsonschema.exceptions.best_match(validator.iter_errors(body))
            if err is not None:
                field = ".".join(str(p) for p in err.absolute_path) or "(the body)"
                out.append(f"fixture {name}: body {i} (sha256 {fx.sha256[i][:12]}): {field}: {err.message[:160]}")
    return out
