"""The production GPU view through NVML (nvidia-ml-py): UUIDs, power limits, memory, Xid events."""

from __future__ import annotations

import threading
import time
from types import ModuleType

WAIT_MS = 500  # how long one event-set wait blocks; bounds how long stop() takes


class NvmlUnavailable(RuntimeError):
    pass


def _nvml() -> ModuleType:
    import pynvml
    return pynvml


def available() -> str | None:
    """None when NVML initialises, else the reason it does not."""
    try:
        nv = _nvml()
        nv.nvmlInit()
        nv.nvmlShutdown()
        return None
    except Exception as exc:
        return f"NVML unavailable: {exc}"


def _uuid(nv: ModuleType, h) -> str:
    u = nv.nvmlDeviceGetUUID(h)
    return u.decode() if isinstance(u, bytes) else u


def read_gpus(nv: ModuleType | None = None) -> dict:
    """UUID, power limit and memory of every GPU (blocking: call it from a worker thread)."""
    nv = nv or _nvml()
    try:
        nv.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
    try:
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"uuid": _uuid(nv, h),
                         "power_limit_w": round(nv.nvmlDeviceGetPowerManagementLimit(h) / 1000),
                         "memory_used_bytes": mem.used, "memory_total_bytes": mem.total})
        return {"gpus": gpus}
    finally:
        nv.nvmlShutdown()


class XidWatcher:
    """Waits on an NVML event set for Xid critical errors in a worker thread and keeps them.

    NVML's event wait blocks, so it lives on its own thread; the event loop only reads `events()`.
    A GPU that cannot report Xid events is listed in `unsupported` rather than silently skipped.
    """

    def __init__(self, nv: ModuleType | None = None) -> None:
        self._nv = nv
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set = None
        self.unsupported: list[str] = []
        self.error: str | None = None

    def start(self) -> None:
        nv = self._nv = self._nv or _nvml()
        try:
            nv.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
        self._set = nv.nvmlEventSetCreate()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._set)
            except nv.NVMLError as exc:
                self.unsupported.append(f"{_uuid(nv, h)}: {exc}")
        self._thread = threading.Thread(target=self._run, name="nvml-xid-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nv = self._nv
        assert nv is not None  # start() loaded NVML before it started this thread
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    continue
                self.error = f"NVML event wait failed: {exc}"
                return
            ev = {"gpu": _uuid(nv, data.device), "xid": int(data.eventData), "wall_ns": time.time_ns()}
            with self._lock:
                self._events.append(ev)

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 4)
        if self.running:
            # Freeing the set under a wait still blocked in NVML would be a use-after-free; a leaked
            # set on a wedged driver is the lesser harm, and it is said.
            self.error = self.error or "NVML event wait did not return; the event set was left allocated"
            return
        nv = self._nv
        if self._set is not None and nv is not None:
            try:
                nv.nvmlEventSetFree(self._set)
            finally:
                self._set = None
                nv.nvmlShutdown()
