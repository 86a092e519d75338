"""The daemon's HTTP clients to a host: every one with the process's one TLS context and no cookie jar."""

from __future__ import annotations

import functools
import ssl
from http.cookiejar import CookieJar

import httpx


# A kept connection the host closed while it sat idle fails before any byte of an answer comes back.
# Only these errors are retried, once, and only for calls that change nothing or that set a state
# (retrying them cannot do anything twice); a generation, load or unload is never retried.
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), built once:
    building one loads the whole CA store, tens of milliseconds of CPU, and every client made
    without one builds its own (a window makes several; a pool of daemons on one machine felt it)."""
    return httpx.create_ssl_context()


class NoCookies(CookieJar):
    """A jar that keeps nothing. httpx keeps a client's cookies and sends them back; a window's requests
    are the plan's bodies and headers alone (a load balancer's sticky-session cookie would pin the
    routed path to one backend, and one window's requests would differ from the next's)."""

    def extract_cookies(self, response, request) -> None:  # noqa: ANN001 - CookieJar's signature
        return None

    def set_cookie(self, cookie) -> None:  # noqa: ANN001
        return None


def host_client(**kwargs) -> httpx.AsyncClient:
    """An httpx client for a host's services (`kwargs`: httpx's own: timeout, transport, limits, headers)."""
    return httpx.AsyncClient(verify=tls_context(), cookies=NoCookies(), **kwargs)
