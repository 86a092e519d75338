"""systemd notifications: never able to stall the daemon, and not one datagram per commit."""

from __future__ import annotations

import socket
import threading

from flare_diag.daemon.service.notify import Notifier


def _unread_socket(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify.sock"))
    return s


def test_a_notify_socket_nobody_reads_never_blocks_the_sender(tmp_path):
    rx = _unread_socket(tmp_path)  # its queue fills after a few datagrams (net.unix.max_dgram_qlen)
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    t = threading.Thread(target=lambda: [n.status(f"status {i}", force=True) for i in range(200)], daemon=True)
    t.start()
    t.join(timeout=30)
    rx.close()
    assert not t.is_alive()


def test_an_unchanged_status_is_not_sent_again(tmp_path):
    rx = _unread_socket(tmp_path)
    rx.settimeout(0.5)
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    n.status("idle", force=True)
    n.status("idle", force=True)
    got = [rx.recv(4096)]
    try:
        got.append(rx.recv(4096))
    except TimeoutError:
        pass
    rx.close()
    assert got == [b"STATUS=idle"]


def test_status_updates_in_quick_succession_are_skipped_unless_forced(tmp_path, monkeypatch):
    import flare_diag.daemon.service.notify
    monkeypatch.setattr(flare_diag.daemon.service.notify, "STATUS_MIN_INTERVAL_S", 3600.0)  # "quick" whatever the machine's pace
    rx = _unread_socket(tmp_path)
    rx.settimeout(0.5)
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    n.status("a", force=True)
    n.status("b")  # within the minimum interval of "a": skipped
    n.status("c", force=True)
    got = []
    try:
        while True:
            got.append(rx.recv(4096))
    except TimeoutError:
        pass
    rx.close()
    assert got == [b"STATUS=a", b"STATUS=c"]
