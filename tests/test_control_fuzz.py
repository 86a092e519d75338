"""Socket commands an attacker or a broken script might send (issue 52's fuzz suite): every line is one
known command or a refusal, never an exception; a real daemon answers each and stays up, its log unchanged."""

from __future__ import annotations

import json
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare_diag.daemon.service import control
from tests.daemontools import Daemon

TAGS = ["status", "start", "abort", "watch", "report", "archive", "review_sign", "review_list", "launch"]
SLOW = bool(os.environ.get("FLARE_DIAG_SLOW"))  # the long run: `FLARE_DIAG_SLOW=1 pytest tests/test_control_fuzz.py`
EXAMPLES = 20_000 if SLOW else 400

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)
commands = st.fixed_dictionaries({"cmd": st.sampled_from(TAGS)},
                                 optional={k: json_values for k in ("plan_toml", "site", "reason", "window_id", "from_seq",
                                                                    "time_scale", "calibration", "by", "note", "x")})


def _deep(depth: int) -> bytes:
    return b'{"cmd": "start", "plan_toml": "", "site": "s", "calibration": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


lines = (st.binary(max_size=300)
         | commands.map(lambda d: json.dumps(d).encode())
         | st.integers(1, 60_000).map(_deep)
         | st.integers(1, 60_000).map(lambda n: b"[" * n + b"]" * n))


@settings(max_examples=EXAMPLES, deadline=None)
@given(lines)
def test_any_line_decodes_to_one_known_command_or_is_a_refusal(line):
    try:
        cmd = control.decode_command(line)
    except control.BadCommand as exc:
        assert str(exc).startswith("bad command") and "\n" not in str(exc)
    else:
        assert type(cmd).__name__ in {"Status", "Start", "Abort", "Watch", "Report", "Archive", "ReviewSign", "ReviewList"}


def _exchange(path, line: bytes) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(str(path))
        s.sendall(line + b"\n")
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return [json.loads(x) for x in buf.splitlines()]


@pytest.fixture(scope="module")
def idle_daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("fuzzed")).start()
    yield d
    d.stop()


@settings(max_examples=300 if SLOW else 40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines.filter(lambda b: b"\n" not in b and len(b) < 200_000))
def test_a_daemon_fed_any_line_answers_it_and_stays_up_with_its_log_unchanged(idle_daemon, line):
    head = idle_daemon.status()["log"]["head_seq"]
    replies = _exchange(idle_daemon.socket, line)
    # one reply a command; a watch streams (here: none running, so its end at once)
    assert all("ok" in r for r in replies) and (len(replies) <= 1 or b"watch" in line), replies
    if replies and not replies[0]["ok"]:
        assert "\n" not in replies[0]["error"] and "Traceback" not in replies[0]["error"]
    assert idle_daemon.proc.poll() is None
    st_ = idle_daemon.status()
    assert st_["state"] == "idle" and st_["window"] is None
    # a status, a report or a review list reads; a bad or refused command changes nothing; a review
    # sign is the one command that appends (its event), and only when well formed
    assert st_["log"]["head_seq"] == head or (replies and replies[0]["ok"] and b"review_sign" in line)


def test_the_daemons_journal_has_no_traceback_after_the_fuzzed_lines(idle_daemon):
    assert "Traceback" not in idle_daemon.log_path.read_text()
