"""The daemon's own Prometheus metrics, for the SREs who alert on it (served only with --metrics-address).

The event loop publishes an immutable snapshot of the service's state after every commit and every
change of state; prometheus-client's HTTP server thread reads the latest snapshot on each scrape, so a
scrape never walks a structure the loop is changing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from flare_diag.events.stages import Stage

STATES = ("idle", "running", "stopping", "needs_attention")
STAGES = tuple(s.value for s in Stage if s != Stage.IDLE)  # a window's stages (events/stages.py)
OUTCOMES = ("completed", "partial", "aborted", "restore_failed")


def parse_address(spec: str) -> tuple[str, int]:
    """'HOST:PORT' (port 0: any free one); ValueError naming what was expected."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--metrics-address {spec!r}: expected HOST:PORT, for example 127.0.0.1:9464")
    return host.strip("[]"), int(port)


class ServiceMetrics(Collector):
    def __init__(self) -> None:
        self.snapshot: dict = {"state": "idle", "window": None, "last_window": None, "aborts": {}, "stuck": False}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: WSGIServer | None = None
        self.fleet: Callable[[], dict[str, Any]] | None = None  # the fleet link's status (shipping lag, lease), read at each scrape

    def publish(self, snapshot: dict) -> None:
        """From the loop: the state the next scrape shows (replaced whole, never changed in place)."""
        self.snapshot = snapshot

    def serve(self, host: str, port: int) -> tuple[str, int]:
        server, _thread = start_http_server(port, host, self.registry)
        self._server = server
        return host, server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def collect(self) -> Iterator:
        s = self.snapshot
        w, last = s["window"], s["last_window"]
        state = GaugeMetricFamily("flare_diag_state", "the service's state (1 for the current one)", labels=["state"])
        for st in STATES:
            state.add_metric([st], 1.0 if s["state"] == st else 0.0)
        yield state
        yield GaugeMetricFamily("flare_diag_window_running", "1 while a window runs", value=1.0 if w else 0.0)
        stage = GaugeMetricFamily("flare_diag_window_stage", "the running window's stage (1 for the current one)",
                                  labels=["stage"])
        for st in STAGES:
            stage.add_metric([st], 1.0 if w and w.get("stage") == st else 0.0)
        yield stage
        phase = GaugeMetricFamily("flare_diag_window_phase", "the running window's phase (1 while it runs)",
                                  labels=["window_id", "phase"])
        if w and w.get("phase"):
            phase.add_metric([w["window_id"], w["phase"]], 1.0)
        yield phase
        # every gauge is present from start-up, in base units; a value with nothing to say is NaN
        minute = (w or {}).get("minute")
        yield GaugeMetricFamily("flare_diag_window_elapsed_seconds", "the running window's window-clock seconds since "
                                "t0 (NaN when no window runs or before t0)",
                                value=float("nan") if minute is None else minute * 60.0)
        yield GaugeMetricFamily("flare_diag_window_requests", "requests the running window has measured (0 when none runs)",
                                value=float((w or {}).get("requests") or 0))
        aborts = CounterMetricFamily("flare_diag_aborts", "windows aborted, by reason (since the daemon started)",
                                     labels=["reason"])
        for reason, n in sorted(s["aborts"].items()):
            aborts.add_metric([reason], float(n))
        yield aborts
        outcome = GaugeMetricFamily("flare_diag_last_outcome", "the last closed window's outcome (1 for it)",
                                    labels=["outcome"])
        for o in OUTCOMES:
            outcome.add_metric([o], 1.0 if last and last.get("outcome") == o else 0.0)
        yield outcome
        verified = float("nan")  # no window has closed since the daemon started
        if last is not None:
            ok = last.get("outcome") is not None and not last.get("restoration_failed") \
                and last.get("outcome") != "restore_failed"
            verified = 1.0 if ok else 0.0
        yield GaugeMetricFamily("flare_diag_last_restoration_verified",
                                "1 if the last closed window's restoration verified, 0 if not, NaN before any closed",
                                value=verified)
        left = s["stuck"] or bool(last and last.get("outcome") == "restore_failed")
        if self.fleet is not None:
            f = self.fleet()
            yield GaugeMetricFamily("flare_diag_fleet_lag_events", "committed events not yet in the fleet database",
                                    value=float(f.get("lag_events") or 0))
            yield GaugeMetricFamily("flare_diag_fleet_lag_seconds", "age of the oldest committed event not yet shipped",
                                    value=float(f.get("lag_s") or 0))
            yield GaugeMetricFamily("flare_diag_fleet_shipping_up", "1 while the fleet database takes this host's events",
                                    value=0.0 if f.get("error") or f.get("fork") else 1.0)
            yield GaugeMetricFamily("flare_diag_fleet_lease_held", "1 while this host holds its pool's lease",
                                    value=1.0 if f.get("lease") else 0.0)
        yield GaugeMetricFamily("flare_diag_primary_left_quiesced",
                                "1 when no window runs and the primary may still be out of rotation (or back in it unverified, "
                                "by someone else's hand): a restore that did not verify, or a window left unfinished; "
                                "a person is needed",
                                value=1.0 if left and not w else 0.0)
