"""The production GPU view through NVML (nvidia-ml-py): UUIDs, power limits, memory, Xid events."""

from __future__ import annotations


class NvmlUnavailable(RuntimeError):
    pass


def available() -> str | None:
    """None when NVML initialises, else the reason it does not."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return None
    except Exception as exc:
        return f"NVML unavailable: {exc}"


def read_gpus() -> dict:
    import pynvml
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            gpus.append({"uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                         "power_limit_w": round(pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000),
                         "memory_used_bytes": mem.used, "memory_total_bytes": mem.total})
        return {"gpus": gpus, "xid_events": []}
    finally:
        pynvml.nvmlShutdown()
