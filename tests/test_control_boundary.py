"""What a member of the socket's group can and cannot make flare-diagd do (issue 18, item 1)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.daemontools import PLAN, Daemon, SocketThread


class Listener(SocketThread):
    """A loopback port that records whoever connects and what they send (a thief's endpoint)."""

    def __init__(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.settimeout(0.2)
        self.port = sock.getsockname()[1]
        self.received: list[bytes] = []
        super().__init__(sock)

    def take(self) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(1)
        try:
            self.received.append(conn.recv(65536))
        except OSError:
            self.received.append(b"")
        finally:
            conn.close()


@pytest.fixture
def setting(tmp_path):
    """The operator's sites directory (empty), a secret only the daemon may read, a thief's listener,
    and a profile the thief wrote outside the sites directory that points the tokens at it."""
    sites = tmp_path / "sites"
    sites.mkdir()
    secret = tmp_path / "creds" / "serving.token"
    secret.parent.mkdir()
    secret.write_text("the-serving-token-0123456789")
    thief = Listener()
    evil = tmp_path / "mine" / "evil.toml"
    evil.parent.mkdir()
    svc = f'url = "http://127.0.0.1:{thief.port}"\ntoken_file = "credential:serving.token"\n'
    evil.write_text(f'[serving]\n{svc}[manager]\n{svc}candidate_recipe = "c"\n[gpu]\nsource = "sim"\n'
                    f'url = "http://127.0.0.1:{thief.port}"\n')
    d = Daemon(tmp_path, sites=sites, env={"CREDENTIALS_DIRECTORY": str(secret.parent)}).start()
    yield d, evil, thief, secret
    d.stop()
    thief.close()


def _call(d: Daemon, cmd: dict) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(d.socket))
        s.sendall(json.dumps(cmd).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def _start(site: str) -> dict:
    return {"cmd": "start", "plan_toml": PLAN.read_text(), "plan_label": "p.toml", "site": site, "time_scale": 100.0}


@pytest.mark.parametrize("how", ["absolute path", "relative path", "path without suffix", "credential name"])
def test_a_start_naming_a_profile_outside_the_sites_directory_sends_no_token_anywhere(setting, how):
    d, evil, thief, secret = setting
    site = {"absolute path": str(evil), "relative path": "../mine/evil.toml",
            "path without suffix": str(evil.with_suffix("")), "credential name": "credential:serving.token"}[how]
    rep = _call(d, _start(site))
    assert not rep["ok"] and "expected the name of a site profile" in rep["error"]
    assert d.status()["state"] == "idle"
    assert not any(secret.read_bytes() in r for r in thief.received) and thief.received == []


def test_the_old_start_naming_files_by_path_is_refused_without_reading_them(setting):
    d, evil, thief, _secret = setting
    rep = _call(d, {"cmd": "start", "plan": str(PLAN), "site": str(evil)})
    assert not rep["ok"] and "bad command" in rep["error"]
    assert thief.received == []


def test_refusals_say_nothing_about_files_the_caller_names(setting, tmp_path):
    d, _evil, _thief, secret = setting
    unreadable = tmp_path / "sites" / "private.toml"
    unreadable.write_text("db_password = 'x'\n")
    unreadable.chmod(0)
    # a file that exists (even one the daemon can read), one that does not, and one in the sites
    # directory that is not a profile: the replies to names that are not site names are identical
    replies = [_call(d, _start(n))["error"].replace(n[:80], "N") for n in (str(secret), "/no/such/file", "../creds/serving")]
    assert len(set(replies)) == 1 and "the-serving-token" not in replies[0]


def test_refused_starts_do_not_grow_the_event_log(setting):
    d, _evil, _thief, _secret = setting
    head = d.status()["log"]["head_seq"]
    for i in range(50):
        assert not _call(d, _start(f"../nope{i}"))["ok"]
    assert not _call(d, _start("no-such-site"))["ok"]
    assert d.status()["log"]["head_seq"] == head


def test_a_plan_can_name_no_fixture_folder_outside_the_search_path(setting):
    d, _evil, _thief, _secret = setting
    plan = PLAN.read_text().replace('name = "c1-52"', 'name = "../../etc"', 1)
    rep = _call(d, {**_start("anything"), "plan_toml": plan})
    assert not rep["ok"] and "fixtures[0].name" in rep["error"]

