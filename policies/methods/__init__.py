"""The methods a plan may name (`method = "..."`; the seed's, `cache_diagnostics`, when it names none)."""

from __future__ import annotations

from flare_diag.policies.method import Method
from flare_diag.policies.plan import METHOD_NAMES
from flare_diag.policies.methods import cache_diagnostics

DEFAULT = cache_diagnostics.METHOD.name

_KNOWN: dict[str, Method] = {cache_diagnostics.METHOD.name: cache_diagnostics.METHOD}


def register(method: Method) -> None:
    """Makes `method` nameable by plans; a second method under a name already taken is refused."""
    known = _KNOWN.get(method.name)
    if known is not None and known is not method:
        raise ValueError(f"a method named {method.name!r} is already registered")
    _KNOWN[method.name] = method
    METHOD_NAMES.add(method.name)


def method_named(name: str) -> Method | None:
    return _KNOWN.get(name)
