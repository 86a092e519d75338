"""Every numeric key of a plan has one range, and a value outside it is refused naming the key."""

from __future__ import annotations

import typing
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flare_diag.policies.plan import Plan, PlanError, decode_plan
from flare_diag.policies.ranges import RANGES
from tests.policy_world import PLAN_PATH

ROOT = Path(__file__).resolve().parent.parent


def _numeric_keys(struct: type, prefix: str = "") -> set[str]:
    """Every int or float field reachable in the plan schema, as the table spells its key."""
    out: set[str] = set()
    hints = typing.get_type_hints(struct)
    for name in struct.__struct_fields__:
        out |= _keys_of(hints[name], f"{prefix}{name}")
    return out


def _keys_of(tp: object, key: str) -> set[str]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (int, float):
        return {key}
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _numeric_keys(tp, f"{key}.")
    if origin is list:
        return _keys_of(args[0], f"{key}[]")
    if origin is dict:
        return set()  # a map of names (follow_on.model_reused_tokens): its numbers are only held finite
    return set().union(*(_keys_of(a, key) for a in args)) if args else set()


def test_every_numeric_field_of_the_plan_schema_has_a_range():
    missing = sorted(_numeric_keys(Plan) - set(RANGES))
    assert not missing, f"numeric plan keys without a range in policies/ranges.RANGES: {missing}"


def test_every_range_names_a_field_of_the_plan_schema():
    assert sorted(set(RANGES) - _numeric_keys(Plan)) == []


def _with(section: str, key: str, value: object) -> bytes:
    """The shipped plan with `[section] key = value` (the section's own line may carry a comment)."""
    out, inside, found = [], False, False
    for ln in PLAN_PATH.read_text().split("\n"):
        header = ln.split("#")[0].strip()
        if ln.startswith("["):
            inside = header == f"[{section}]"
        if inside and ln.split("=")[0].strip() == key:
            continue
        out.append(ln)
        if inside and header == f"[{section}]":
            out.append(f"{key} = {value}")
            found = True
    assert found, f"the shipped plan has no [{section}]"
    return "\n".join(out).encode()


@pytest.mark.parametrize("section,key,value,words", [
    ("growth", "max_gpu_memory_fraction", 0, "growth.max_gpu_memory_fraction = 0: expected (0, 1]"),
    ("growth", "max_gpu_memory_fraction", 1.5, "expected (0, 1]"),
    ("timing", "watch_lost_s", 1, "no shorter than the daemon's own poll of a watch (5 s)"),
    ("timing", "drain_timeout_s", 0, "timing.drain_timeout_s = 0: expected (0, 86400]"),
    ("timing", "drain_timeout_s", -3, "expected (0, 86400]"),
    ("timing", "stable_observations", 1, "consecutive observations"),
    ("growth", "max_resident_bytes", 0, "bytes, above 0"),
    ("rates", "output_share", 0, "a fraction of max_tokens"),
    ("sampling", "top_p", 0, "a probability mass"),
])
def test_a_value_outside_its_range_is_refused_naming_the_key_and_the_range(section, key, value, words):
    with pytest.raises(PlanError) as e:
        decode_plan(_with(section, key, value))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_rejected_streak_is_at_least_1():
    with pytest.raises(PlanError, match=r"abort.rejected_streak = 0: expected \[1, 1000\]"):
        decode_plan(PLAN_PATH.read_bytes() + b"\n[abort]\nrejected_streak = 0\n")


@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70)))
def test_any_number_for_a_bound_is_taken_within_its_range_or_refused_in_one_line(value):
    try:
        plan = decode_plan(_with("growth", "max_gpu_memory_fraction", repr(value) if isinstance(value, float) else value))
    except PlanError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 < plan.growth.max_gpu_memory_fraction <= 1


@pytest.mark.parametrize("plan", sorted((ROOT / "fixtures" / "plans").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_plan_passes_plan_check(plan, capsys):
    from flare_diag.daemon.cli.commands import main
    assert main(["plan", "check", str(plan)]) == 0, capsys.readouterr()
