"""A cookie jar that keeps nothing: no cookie a host sets rides on the daemon's later requests."""

from __future__ import annotations

from http.cookiejar import CookieJar


class NoCookies(CookieJar):
    """httpx keeps a client's cookies in a jar like this one and sends them back; a window's requests
    are the plan's bodies and headers alone (a load balancer's sticky-session cookie would pin the
    routed path to one backend, and one window's requests would differ from the next's)."""

    def extract_cookies(self, response, request) -> None:  # noqa: ANN001 - CookieJar's signature
        return None

    def set_cookie(self, cookie) -> None:  # noqa: ANN001
        return None
