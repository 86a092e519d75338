"""What `flare-diag start` shows while the daemon answers: a spinner on a terminal, gone with the answer."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path

import pytest
from rich.console import Console

from flare_diag.daemon.cli import client
from flare_diag.daemon.service import control


@pytest.fixture
def daemon_answering(tmp_path: Path):
    """A unix socket that answers one command, as the daemon answers a start, with `answer`."""
    path = tmp_path / "control.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    answers: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn, conn.makefile("rb") as lines:
            if lines.readline().endswith(b"\n"):  # the whole command, then the answer
                conn.sendall(answers[0])

    def start(answer: bytes) -> Path:
        answers.append(answer)
        threading.Thread(target=serve, daemon=True).start()
        return path
    yield start
    srv.close()


def _start(path: Path, console: Console) -> int:
    return client.start(path, b'name = "p"\n', "p.toml", "sim", 1.0, console)


def test_a_start_on_a_terminal_says_what_the_daemon_is_doing_while_it_waits(daemon_answering, capsys):
    out = io.StringIO()
    path = daemon_answering(control.reply(window_id="w-1", rehearsal=True))
    assert _start(path, Console(file=out, force_terminal=True, width=400)) == 0
    shown = out.getvalue()
    assert "checking the site (read-only)" in shown and "Ctrl-C stops waiting, not the start" in shown
    assert shown.index("checking the site") < shown.index("started window")
    assert capsys.readouterr().out == "w-1\n"


def test_a_start_whose_stderr_is_not_a_terminal_shows_only_the_answer(daemon_answering, capsys):
    out = io.StringIO()
    path = daemon_answering(control.reply(window_id="w-2", rehearsal=False))
    assert _start(path, Console(file=out, force_terminal=False)) == 0
    assert out.getvalue() == "started window w-2\n"


def test_a_refused_start_on_a_terminal_leaves_no_spinner_behind_the_refusal(daemon_answering):
    out = io.StringIO()
    path = daemon_answering(control.error("no site named 'sim'", code="input"))
    with pytest.raises(client.Refused, match="no site named"):
        _start(path, Console(file=out, force_terminal=True, width=400))
    # the spinner's line is erased when the answer comes (cursor up, erase line): nothing of it stays on screen
    assert out.getvalue().endswith("\x1b[1A\x1b[2K")
