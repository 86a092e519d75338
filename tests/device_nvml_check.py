"""The NVML path against a real GPU (run on a machine with one; not collected by pytest): the daemon's own
`daemon/hosts/nvml.py` (loaded alone: it needs only nvidia-ml-py) reads what `nvidia-smi` reads, sees GPU
memory that a process takes, and its Xid watcher starts, waits and stops cleanly. Prints one JSON object
and exits 1 on any disagreement.

    python3 tests/device_nvml_check.py [OUT.json]
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_nvml_module():
    spec = importlib.util.spec_from_file_location("flare_nvml", ROOT / "daemon" / "hosts" / "nvml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def smi() -> list[dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,power.limit,memory.total,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        uuid, power, total, used = (x.strip() for x in line.split(","))
        rows.append({"uuid": uuid, "power_limit_w": round(float(power)), "memory_total_mib": int(total),
                     "memory_used_mib": int(used)})
    return rows


def main() -> int:
    nvml = load_nvml_module()
    result: dict = {"available": nvml.available(), "problems": []}
    t0 = time.perf_counter()
    gpus = nvml.read_gpus()["gpus"]
    result["read_gpus_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    reads = []
    for _ in range(20):
        t = time.perf_counter()
        nvml.read_gpus()
        reads.append((time.perf_counter() - t) * 1e3)
    result["read_gpus_ms_median_of_20"] = round(sorted(reads)[10], 2)
    result["nvml"], result["nvidia_smi"] = gpus, smi()
    for ours, theirs in zip(gpus, result["nvidia_smi"]):
        if ours["uuid"] != theirs["uuid"] or ours["power_limit_w"] != theirs["power_limit_w"] \
                or ours["memory_total_bytes"] // 2**20 != theirs["memory_total_mib"]:
            result["problems"].append(f"NVML and nvidia-smi differ: {ours} vs {theirs}")
    watcher = nvml.XidWatcher()
    watcher.start()
    result["xid_unsupported"] = watcher.unsupported
    try:  # a process takes GPU memory: the memory the window's bound reads must move with it
        import torch
        before = nvml.read_gpus()["gpus"][0]["memory_used_bytes"]
        block = torch.empty(8 << 30, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        after = nvml.read_gpus()["gpus"][0]["memory_used_bytes"]
        del block
        torch.cuda.empty_cache()
        result["memory_used_delta_gib"] = round((after - before) / 2**30, 2)
        if not 7.5 <= (after - before) / 2**30 <= 9.0:
            result["problems"].append(f"8 GiB taken moved memory_used by {(after - before) / 2**30:.2f} GiB")
    except Exception as exc:  # noqa: BLE001 - said in the result
        result["problems"].append(f"torch could not take GPU memory: {exc}")
    time.sleep(3)
    result["xid_events"] = watcher.events()
    result["xid_running_before_stop"] = watcher.running
    t = time.perf_counter()
    watcher.stop()
    result["xid_stop_s"] = round(time.perf_counter() - t, 3)
    result["xid_running_after_stop"], result["xid_error"] = watcher.running, watcher.error
    if watcher.running or watcher.error or not result["xid_running_before_stop"]:
        result["problems"].append("the Xid watcher did not run and stop cleanly")
    text = json.dumps(result, indent=2)
    print(text)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    return 1 if result["problems"] or result["available"] is not None else 0


if __name__ == "__main__":
    sys.exit(main())
