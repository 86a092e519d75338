"""Mistaken inputs at the console: each is one line naming the input and what was expected, never a
traceback, never a hang (issue 52's list, as far as this build has answered it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main

LONG_SOCKET = "/tmp/" + "x" * 120 + "/control.sock"

# argv -> (exit code, words the one line must hold)
CASES = [
    (["rehearse", "--out", "/etc/hostname"], 2, "--out /etc/hostname: not a folder"),
    (["rehearse", "--out", "/etc/hostname/inside"], 2, "a part of the path is a file"),
    (["sim", "serve", "--port", "99999"], 2, "--port 99999: expected 0 to 65535"),
    (["sim", "serve", "--port", "-1"], 2, "--port -1: expected 0 to 65535"),
    (["sim", "serve", "--time-scale", "inf"], 2, "--time-scale inf: expected a finite factor"),
    (["plan", "check", "/dev/zero"], 2, "/dev/zero: the plan is a device; expected a regular file"),
    (["plan", "check", "/tmp"], 2, "/tmp: the plan is a folder; expected a regular file"),
    (["fleet", "status", "--dsn", "garbage=1=2"], 2, "the DSN does not parse"),
    (["fleet", "status", "--dsn", "postgresql://u:s3cret@127.0.0.1/x"], 2, "names a password"),
    (["fleet", "status", "--dsn", "postgresql://u@127.0.0.1/x?password=s3cret"], 2, "names a password"),
    (["fleet", "status", "--dsn", "host=127.0.0.1 dbname=x password=s3cret"], 2, "names a password"),
    (["fleet", "windows", "--dsn", "host=127.0.0.1 dbname=x", "--since", "last tuesday"], 2,
     "argument --since: 'last tuesday': expected an ISO 8601 date or time"),
    (["fleet", "windows", "--dsn", "host=127.0.0.1 port=1 dbname=x"], 2, "fleet database host=127.0.0.1 port=1 dbname=x: cannot connect"),
    (["status", "--socket", LONG_SOCKET], 5, "longer than a unix socket's path may be"),
    (["log", "verify", "a\x00b"], 2, "an argument holds a NUL byte"),
    (["plan", "check", "\x00"], 2, "an argument holds a NUL byte"),
    (["reproduce", "--trace", "t.jsonl", "--capacity-blocks", "10", "--limit", "-1"], 2, "argument --limit: -1: expected [1, 2^62]"),
    (["reproduce", "--trace", "t.jsonl", "--capacity-blocks", "0"], 2, "argument --capacity-blocks: 0: expected [1, 1e+09]"),
    (["reproduce", "--trace", "t.jsonl", "--capacity-blocks", "9", "--tolerance", "-5"], 2, "argument --tolerance: -5"),
    (["watch", "--from-seq", "-1"], 2, "argument --from-seq: -1: expected [0, 2^62]"),
    (["report", "compare", "--repeats", "0"], 2, "argument --repeats: 0: expected [1, 20]"),
    (["fleet", "pool", "set", "p", "--max-down", "-1"], 2, "argument --max-down: -1: expected [0, 10000]"),
    (["fleet", "campaign", "create", "--plan", "p", "--site", "s", "--hosts", "h", "--visibility-s", "nan"], 2,
     "argument --visibility-s: nan: expected [1, 86400]"),
    (["fleet", "campaign", "create", "--plan", "p", "--site", "s", "--hosts", "h", "--retries", "1e3"], 2,
     "argument --retries: '1e3': expected a whole number"),
]


@pytest.mark.parametrize("argv,rc,words", CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_a_mistaken_input_is_one_line_naming_it(capsys, argv, rc, words):
    try:
        got = main(argv)
    except SystemExit as exc:  # a flag argparse refuses: its own one line, as the console shows it
        got = exc.code
    assert got == rc
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err
    assert "s3cret" not in err


def test_a_fleet_password_in_the_environment_is_refused_and_never_shown(monkeypatch, capsys):
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    assert main(["fleet", "status", "--dsn", "host=127.0.0.1 dbname=x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PGPASSWORD is set in the environment" in err and "s3cret" not in err


def test_a_plan_that_is_a_fifo_is_refused_at_once_not_read_for_ever(tmp_path, capsys):
    fifo = tmp_path / "plan.toml"
    os.mkfifo(fifo)
    assert main(["plan", "check", str(fifo)]) == 2  # no writer: a plain read would block here for ever
    assert "the plan is a FIFO; expected a regular file" in capsys.readouterr().err


def test_a_site_profile_that_is_a_device_is_refused(tmp_path, capsys):
    assert main(["site", "check", "/dev/null"]) == 2
    assert "the site profile is a device" in capsys.readouterr().err


def test_a_fixture_whose_bodies_are_not_a_regular_file_is_refused(tmp_path, capsys):
    from flare_diag.daemon.hosts.fixture import FixtureError, load_fixture
    (tmp_path / "fx").mkdir()
    (tmp_path / "fx" / "manifest.json").write_text('{"name": "fx", "count": 0, "sha256": []}')
    os.mkfifo(tmp_path / "fx" / "bodies.jsonl")
    with pytest.raises(FixtureError, match="bodies is a FIFO"):
        load_fixture(Path(tmp_path / "fx"))


def test_a_fixture_body_nested_deeper_than_a_decoder_reads_is_refused_naming_it(tmp_path, capsys):
    import hashlib
    import json
    body = b'{"messages": [], "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    fx = tmp_path / "deep"
    fx.mkdir()
    (fx / "bodies.jsonl").write_bytes(body + b"\n")
    (fx / "manifest.json").write_text(json.dumps({"name": "deep", "count": 1, "sha256": [hashlib.sha256(body).hexdigest()]}))
    from flare_diag.daemon.hosts.fixture import FixtureError, load_fixture
    with pytest.raises(FixtureError, match="body 0 .*nested deeper than a decoder reads"):
        load_fixture(fx)


def test_a_fixture_body_asking_for_several_completions_is_refused_naming_it(tmp_path):
    # one body, one completion: the window reads one answer a body, and holds the engine's finished count
    # to the requests it sent (n completions are n requests to an engine's scheduler)
    import hashlib
    import json
    bodies = [b'{"messages": [{"role": "user", "content": "hi"}], "n": 1}',
              b'{"messages": [{"role": "user", "content": "hi"}], "n": 3}']
    fx = tmp_path / "several"
    fx.mkdir()
    (fx / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
    (fx / "manifest.json").write_text(json.dumps({"name": "several", "count": 2,
                                                  "sha256": [hashlib.sha256(b).hexdigest() for b in bodies]}))
    from flare_diag.daemon.hosts.fixture import FixtureError, load_fixture
    with pytest.raises(FixtureError, match=r"body 1 \(sha256 .*\): n = 3: a window replays one completion a body"):
        load_fixture(fx)


@pytest.mark.parametrize("n", [b"true", b"1.0", b'"1"', b"null"])
def test_a_fixture_body_whose_n_is_one_only_by_coercion_is_refused_naming_it(tmp_path, n):
    # Python's 1 == True == 1.0: what an engine makes of them is its own reading, not the contract's n = 1
    import hashlib
    import json
    body = b'{"messages": [{"role": "user", "content": "hi"}], "n": ' + n + b"}"
    fx = tmp_path / "coerced"
    fx.mkdir()
    (fx / "bodies.jsonl").write_bytes(body + b"\n")
    (fx / "manifest.json").write_text(json.dumps({"name": "coerced", "count": 1, "sha256": [hashlib.sha256(body).hexdigest()]}))
    from flare_diag.daemon.hosts.fixture import FixtureError, load_fixture
    with pytest.raises(FixtureError, match=rf"body 0 \(sha256 .*\): n = {n.decode()}: a window replays one completion"):
        load_fixture(fx)


@pytest.mark.parametrize("state_dir,words", [("/etc/hostname", "not a folder"),
                                             ("/etc/hostname/sub", "/etc/hostname is a file, not a folder")])
def test_a_daemon_state_dir_that_cannot_be_a_folder_is_one_line_and_exit_2(tmp_path, state_dir, words):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon", "--socket", str(tmp_path / "c.sock"), "--state-dir",
                        state_dir, "--sites-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and words in p.stderr and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert not (tmp_path / "c.sock").exists()  # nothing started


@pytest.mark.parametrize("key,value", [("load_timeout_s", "-1.0"), ("load_timeout_s", "nan"), ("load_timeout_s", "1e30")])
def test_a_site_profile_number_outside_its_range_is_one_line_naming_the_key(tmp_path, capsys, key, value):
    (tmp_path / "llama").write_text("#!/bin/sh\n")
    (tmp_path / "llama").chmod(0o755)
    (tmp_path / "m.gguf").write_bytes(b"x")
    (tmp_path / "site.toml").write_text(
        '[serving]\nurl = "http://127.0.0.1:9"\n[engine]\nbinary = "llama"\nincumbent = "a"\ncandidate_recipe = "a"\n'
        f'{key} = {value}\n[engine.recipes.a]\nargs = []\nmodel = "m.gguf"\n[gpu]\nsource = "none"\n')
    assert main(["site", "check", str(tmp_path / "site.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"engine.{key} = " in err and "expected" in err and err.count("\n") == 0, err
