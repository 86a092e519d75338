"""What `site check`'s summary line (the line `run` refuses with) says when a site is not ready."""

from hypothesis import given, strategies as st

from flare_diag.daemon.window.sitecheck import NOT_OBSERVABLE, OBSERVABLE, Capability, SiteCheck


def _not_ready(*caps: Capability, services: dict[str, str] | None = None) -> SiteCheck:
    return SiteCheck("lab-1", "plan", list(caps), dict(services or {}))


def test_a_not_ready_summary_says_why_each_missing_capability_holds_the_window_back():
    check = _not_ready(
        Capability("serving.health", NOT_OBSERVABLE, "the engine exited with status 1 while loading", required=True),
        Capability("serving.usage", OBSERVABLE, "fixture a body 0 streams only when asked", required=True, fits=False),
        Capability("serving.model", OBSERVABLE, "tiny"))
    line = check.summary()
    assert "serving.health: the engine exited with status 1 while loading" in line
    assert "serving.usage: fixture a body 0 streams only when asked" in line
    assert "serving.model: tiny" not in line  # what holds nothing back is not repeated


def test_a_not_ready_summary_names_a_service_that_could_not_be_probed_and_why():
    check = _not_ready(services={"router": "router: unreachable at http://127.0.0.1:9 (connection refused)"})
    assert "router (service)" in check.summary() and "connection refused" in check.summary()


@given(st.text(min_size=1, max_size=3000))
def test_a_reason_of_any_length_or_shape_keeps_the_summary_one_bounded_line(reason):
    line = _not_ready(Capability("serving.health", NOT_OBSERVABLE, reason, required=True)).summary()
    assert "\n" not in line and "\r" not in line and len(line) < 700


def _router_at(tmp_path, url: str) -> dict:
    """`site check --json` of a contract host whose profile names `url` for its router."""
    import json

    from tests.contract_tools import ContractHost
    from tests.test_contract_host import PLAN, flare_diag
    host = ContractHost(tmp_path / "host")
    try:
        text = host.site.read_text()
        host.site.write_text(text.replace(f'url = "{host.urls["router"]}"', f'url = "{url}"'))
        return json.loads(flare_diag("site", "check", str(host.site), "--plan", str(PLAN), "--json").stdout)
    finally:
        host.stop()


def test_a_router_port_nothing_listens_on_is_called_unreachable(tmp_path):
    import socket
    with socket.socket() as s:  # bound, never listening: a connection to it is refused
        s.bind(("127.0.0.1", 0))
        check = _router_at(tmp_path, f"http://127.0.0.1:{s.getsockname()[1]}")
    assert check["services"]["router"].startswith("router: unreachable at http://127.0.0.1:"), check["services"]


def test_a_router_that_accepts_and_closes_without_an_answer_is_not_called_unreachable(tmp_path):
    import socket
    import threading
    srv = socket.create_server(("127.0.0.1", 0))

    def close_each() -> None:  # accepts every connection, reads the request, closes without a byte
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()
    threading.Thread(target=close_each, daemon=True).start()
    try:
        check = _router_at(tmp_path, f"http://127.0.0.1:{srv.getsockname()[1]}")
    finally:
        srv.close()
    said = check["services"]["router"]
    assert said.startswith("router: no answer from http://127.0.0.1:") and "RemoteProtocolError" in said, said
