"""The environment a record was measured in: GPU, driver, CUDA, library versions, clocks.

Read once per run and copied into every record, so that a record stays meaningful on its
own. Clocks come from ``nvidia-smi`` (the SM clock at rest differs from the clock under
load, so it is read again after the timed phase); anything unreadable is ``None``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import time

SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem",
              "temperature.gpu", "power.draw", "pstate")


def nvidia_smi() -> dict | None:
    """The first GPU's ``nvidia-smi --query-gpu`` fields, or None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False))


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def clocks() -> dict:
    smi = nvidia_smi() or {}
    return {"sm_clock_mhz": _number(smi.get("clocks.sm")),
            "sm_clock_max_mhz": _number(smi.get("clocks.max.sm")),
            "mem_clock_mhz": _number(smi.get("clocks.mem")),
            "temperature_c": _number(smi.get("temperature.gpu")),
            "power_w": _number(smi.get("power.draw")),
            "pstate": smi.get("pstate")}


def collect(ncu_version: str | None) -> dict:
    """Everything a record needs to say where it came from (GPU fields None without one)."""
    import torch
    import triton

    env = {"gpu_name": None, "gpu_sm_count": None, "gpu_memory_bytes": None,
           "gpu_l2_bytes": None, "gpu_capability": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu_name=props.name, gpu_sm_count=props.multi_processor_count,
                   gpu_memory_bytes=props.total_memory,
                   gpu_l2_bytes=getattr(props, "L2_cache_size", None),
                   gpu_capability=f"{props.major}.{props.minor}")
    smi = nvidia_smi() or {}
    env.update(driver=smi.get("driver_version"), cuda=torch.version.cuda,
               torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), ncu_version=ncu_version,
               date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    env.update(clocks())
    return env
