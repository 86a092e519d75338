"""The NVML Xid watcher's thread, against a stand-in for the NVML library's API (no GPU here)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import types

import pytest

from flare_diag.daemon.hosts.host import NvmlGpu
from flare_diag.daemon.hosts.nvml import NvmlUnavailable, XidWatcher, read_gpus


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(xids: list[int], supported=(True, True)) -> types.SimpleNamespace:
    """NVML's surface as nvidia-ml-py exposes it: calls, constants, and errors carrying `.value`."""
    pending: queue.Queue[int] = queue.Queue()
    for x in xids:
        pending.put(x)
    nv = types.SimpleNamespace(NVMLError=NVMLError, NVML_ERROR_TIMEOUT=10, NVML_ERROR_NOT_SUPPORTED=3,
                               nvmlEventTypeXidCriticalError=8, calls=[])
    nv.nvmlInit = lambda: nv.calls.append("init")
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: len(supported)
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}".encode()
    nv.nvmlEventSetCreate = lambda: "set"
    nv.nvmlEventSetFree = lambda s: nv.calls.append(f"free {s}")

    def register(h, types_, s):
        if not supported[int(h[1:])]:
            raise NVMLError(3)
    nv.nvmlDeviceRegisterEvents = register

    def wait(s, ms):
        try:
            x = pending.get(timeout=ms / 1000)
        except queue.Empty:
            raise NVMLError(10) from None
        return types.SimpleNamespace(device="h1", eventType=8, eventData=x)
    nv.nvmlEventSetWait_v2 = wait
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1, total=2)
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: 300_000
    return nv


def _until(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.01)
    return pred()


def test_xid_events_from_the_event_set_are_collected_with_their_gpu():
    w = XidWatcher(fake_nvml([79, 48]))
    w.start()
    try:
        assert _until(lambda: len(w.events()) == 2)
    finally:
        w.stop()
    assert [(e["gpu"], e["xid"]) for e in w.events()] == [("GPU-h1", 79), ("GPU-h1", 48)]


def test_a_gpu_that_cannot_report_xids_is_listed_not_skipped():
    w = XidWatcher(fake_nvml([], supported=(True, False)))
    w.start()
    w.stop()
    assert len(w.unsupported) == 1 and w.unsupported[0].startswith("GPU-h1")


def test_stop_ends_the_wait_thread_and_frees_the_event_set():
    nv = fake_nvml([])
    w = XidWatcher(nv)
    w.start()
    w.stop()
    assert not w.running
    assert "free set" in nv.calls and nv.calls[-1] == "shutdown"


def test_a_wait_that_never_returns_leaves_the_event_set_allocated_and_says_so():
    import threading
    nv = fake_nvml([])
    release = threading.Event()

    def wedged(s, ms):  # a driver call that ignores its timeout until the test releases it
        release.wait()
        raise NVMLError(10)
    nv.nvmlEventSetWait_v2 = wedged
    w = XidWatcher(nv)
    w.start()
    try:
        w.stop()
        assert w.running and "left allocated" in (w.error or "")
        assert not [c for c in nv.calls if c.startswith("free") or c == "shutdown"]
    finally:
        release.set()
        w.stop()


def test_read_gpus_reports_uuid_power_limit_and_memory():
    assert read_gpus(fake_nvml([])) == {"gpus": [
        {"uuid": "GPU-h0", "power_limit_w": 300, "memory_used_bytes": 1, "memory_total_bytes": 2},
        {"uuid": "GPU-h1", "power_limit_w": 300, "memory_used_bytes": 1, "memory_total_bytes": 2}]}


def test_read_gpus_without_nvml_says_why():
    nv = fake_nvml([])

    def fail():
        raise NVMLError(9)
    nv.nvmlInit = fail
    with pytest.raises(NvmlUnavailable, match="NVML unavailable"):
        read_gpus(nv)


def _blocking_reads(nv: types.SimpleNamespace) -> tuple[threading.Event, list[int]]:
    """Reads of the GPUs' memory that block until the event is set (a driver that stopped answering), and
    the most of them ever in flight at once."""
    release, inflight, most = threading.Event(), [0], [0]
    memory = nv.nvmlDeviceGetMemoryInfo

    def held(h):
        inflight[0] += 1
        most[0] = max(most[0], inflight[0])
        release.wait(10)
        inflight[0] -= 1
        return memory(h)
    nv.nvmlDeviceGetMemoryInfo = held
    return release, most


async def test_a_gpu_read_nvml_does_not_return_is_not_joined_by_another_thread_at_each_poll():
    nv = fake_nvml([])
    release, most = _blocking_reads(nv)
    gpu = NvmlGpu(nv)
    try:
        for _ in range(5):  # the GPU watch's polls, each under its own deadline
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(gpu.view(), 0.05)
        assert most[0] == 1  # one thread held by the read that never returned, not one a poll
        release.set()
        view = await asyncio.wait_for(gpu.view(), 5)
        assert [g["uuid"] for g in view["gpus"]] == ["GPU-h0", "GPU-h1"] and nv.calls.count("init") == 1 + 2
    finally:
        release.set()
        await gpu.close()


async def test_two_callers_at_once_each_get_a_read_of_their_own_one_after_the_other():
    nv = fake_nvml([])
    release, most = _blocking_reads(nv)
    gpu = NvmlGpu(nv)
    try:
        both = asyncio.gather(gpu.view(), gpu.view())
        for _ in range(500):  # until the first read is held in NVML, however slow the machine
            if most[0]:
                break
            await asyncio.sleep(0.01)
        release.set()
        first, second = await asyncio.wait_for(both, 5)
        assert first["gpus"] and second["gpus"] and first is not second and most[0] == 1
        assert nv.calls.count("init") == 1 + 2  # one Xid watcher's, then each read's own
    finally:
        release.set()
        await gpu.close()
