"""The site's Prometheus, read over its HTTP API: instant queries for the steady-state guards, and
series lookups for `site check`."""

from __future__ import annotations

import math

import httpx

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.httpclient import STALE_CONNECTION, host_client
from flare_diag.daemon.hosts.site import Site, scrub

MAX_SERIES = 1000  # a guard reads one number; a query answering more is cut (and says so)
TIMEOUT_S = 10.0


class Prometheus:
    """`/api/v1/query` and `/api/v1/series` with the site's token; every failure is one ActionFailed
    (`steady_state_unreachable`), never the serving host's error classes: a Prometheus that does not
    answer is a watch that went silent, not an authentication failure of the host under test."""

    def __init__(self, site: Site) -> None:
        ss = site.profile.steady_state
        if ss is None:
            raise ValueError("the site has no [steady_state] prometheus_url")
        self.url = ss.prometheus_url.rstrip("/")
        self.site = site
        tok = site.tokens.get("steady_state")
        self.client = host_client(timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {tok}"} if tok else {})

    async def close(self) -> None:
        await self.client.aclose()

    async def _get(self, path: str, params: dict, what: str) -> object:
        try:
            r = await self._get_once_more(path, params)
            body = r.json()
        except (httpx.HTTPError, ValueError, RecursionError) as exc:  # RecursionError: a `[[[[...` answer
            raise ActionFailed("steady_state_unreachable", f"{what}: {type(exc).__name__}") from None
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error") if isinstance(body, dict) else None
            raise ActionFailed("steady_state_unreachable",
                               scrub(f"{what}: HTTP {r.status_code}" + (f": {str(why)[:200]}" if why else ""),
                                     self.site.tokens.values()))
        return body.get("data")

    async def _get_once_more(self, path: str, params: dict) -> httpx.Response:
        """A query changes nothing: once more if Prometheus had closed the kept connection (its idle
        timeout) as the query went out; a watch is not lost to that."""
        try:
            return await self.client.get(f"{self.url}{path}", params=params)
        except STALE_CONNECTION:
            return await self.client.get(f"{self.url}{path}", params=params)

    async def query(self, query: str) -> dict:
        """{"values": [one number per series, at most MAX_SERIES], "series": how many answered}."""
        data = await self._get("/api/v1/query", {"query": query}, "prometheus query")
        if not isinstance(data, dict):
            raise ActionFailed("steady_state_unreachable", "prometheus query: an answer without data")
        kind, result = data.get("resultType"), data.get("result")
        try:
            if kind == "scalar":
                values = [float(result[1])]  # type: ignore[index]  # a scalar result is [time, value]
            elif kind == "vector":
                values = [float(s["value"][1]) for s in result[:MAX_SERIES]]  # type: ignore[index]  # a vector result is a list of samples
            else:
                raise ActionFailed("steady_state_unreachable",
                                   f"prometheus query: a {kind} answer; a guard's query must give a number or a vector")
        except (TypeError, ValueError, KeyError, IndexError):
            raise ActionFailed("steady_state_unreachable", "prometheus query: a malformed answer") from None
        # NaN (0/0 on an idle path) and infinities say nothing a threshold can judge: left out, counted
        return {"values": [v for v in values if math.isfinite(v)],
                "series": len(result) if kind == "vector" else 1}  # type: ignore[arg-type]  # a vector result is a list of samples

    async def series(self, selector: str) -> int:
        """How many series the selector names now (0: Prometheus knows no such series)."""
        data = await self._get("/api/v1/series", {"match[]": selector}, "prometheus series")
        return len(data) if isinstance(data, list) else 0
