"""Flags as a mistaken or hostile operator types them (issue 52's fuzz suite): any value for any of the
offline commands' numeric flags ends in a result, or one line and exit 2 (5: no daemon there), never a
traceback."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare_diag.daemon.cli.commands import main

ROOT = Path(__file__).resolve().parent.parent
PLAN = str(ROOT / "fixtures" / "plans" / "peer-vllm.toml")
TRACE = str(ROOT / "tests" / "data" / "mooncake" / "conversation-1000.jsonl")
EXAMPLES = 3000 if os.environ.get("FLARE_DIAG_SLOW") else 150

values = st.one_of(st.integers(-10**20, 10**20).map(str), st.floats().map(str), st.text(max_size=12),
                   st.sampled_from(["0", "-1", "1", "nan", "inf", "-inf", "1e400", "", " ", "0x10", "٣"]))


def _argv(draw) -> list[str]:
    kind = draw(st.sampled_from(["reproduce", "watch", "status", "report", "forecast", "check"]))
    if kind == "reproduce":
        argv = ["reproduce", "--trace", TRACE, "--limit", "50"]
        for flag in draw(st.lists(st.sampled_from(["--capacity-blocks", "--capacity-rows", "--limit", "--tolerance"]),
                                  min_size=1, max_size=3)):
            argv += [flag, draw(values)]
        return argv
    if kind in ("watch", "status"):
        return [kind, "--socket", "/nonexistent/flare.sock", *(["--from-seq", draw(values)] if kind == "watch" else [])]
    if kind == "report":
        return ["report", "compare", "--repeats", draw(values), "--windows", "a", "--baseline", "b"]
    if kind == "forecast":
        return ["plan", "forecast", PLAN, "--seed", draw(values), "--simulate", draw(st.sampled_from(["0", "-3", "x", "1e9"]))]
    return ["plan", "check", PLAN, "--json"] if draw(st.booleans()) else ["plan", "check", draw(values)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_flag_value_is_a_result_or_one_line_and_exit_2(capsys, data):
    argv = data.draw(st.composite(lambda draw: _argv(draw))())
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's refusal: its own one line
        rc = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err[-2000:])
    assert rc in (0, 1, 2, 5), (argv, rc, err[-500:])
    if rc in (2, 5):
        assert err.strip() and err.strip().count("\n") == 0, (argv, err)
