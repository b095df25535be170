"""SYNTHETIC validation records for tests — made up here, never measured on any GPU.

Every record built here says so twice: ``"synthetic": true`` and an environment whose GPU
name ends in "(SYNTHETIC test fixture)". Real records live in ``validation/records/``.
"""

from __future__ import annotations

import functools

from simulator.prediction import count_prediction
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.matrix import config_id, kernel_names
from validation.records import SCHEMA

SYNTHETIC_ENV = {"gpu_name": "NVIDIA H200 (SYNTHETIC test fixture)", "driver": None,
                 "cuda": None, "torch": None, "triton": None, "ncu_version": None,
                 "date_utc": "2000-01-01T00:00:00Z", "sm_clock_mhz": None,
                 "note": "synthetic test fixture, not a measurement"}


def record(schedule: str, problem: AttentionProblem, tiling: Tiling, median_s: float,
           counters: dict | None = None, env: dict | None = None) -> dict:
    """One synthetic, clearly labelled record."""
    return {
        "schema": SCHEMA, "record_id": config_id(schedule, problem, tiling),
        "run_id": "synthetic", "matrix": "synthetic", "plan_sha256": "0" * 16,
        "synthetic": True, "environment": dict(env or SYNTHETIC_ENV),
        "implementation": "triton", "schedule": schedule, "problem": problem.to_dict(),
        "tiling": tiling.to_dict(), "kernel": "+".join(kernel_names(schedule, problem, tiling)),
        "kernels": kernel_names(schedule, problem, tiling),
        "correctness": {"ok": True, "max_abs_error": 1e-3, "reason": None},
        "timing": {"median_s": median_s, "p20_s": median_s * 0.99, "p80_s": median_s * 1.01,
                   "tflops": problem.convention_flops() / median_s / 1e12},
        "timing_reason": None,
        "counters": counters,
        "counters_reason": None if counters else "synthetic record without counters",
    }


def counters(dram_bytes: float, l2_bytes: float) -> dict:
    """Counters as ``validation.ncu.counters`` lays them out (reads only, for simplicity)."""
    return {"dram_read_bytes": dram_bytes, "dram_write_bytes": 0.0,
            "l2_read_sectors": l2_bytes / 32, "l2_write_sectors": 0.0,
            "l2_read_bytes": l2_bytes, "l2_write_bytes": 0.0, "l2_hit_rate_pct": 50.0,
            "smem_bytes": None, "duration_s": None, "kernels": []}


@functools.cache
def _counts(problem: AttentionProblem, tiling: Tiling, schedule: str) -> tuple:
    from simulator.hardware import load_hardware

    pred = count_prediction(problem, tiling, schedule, load_hardware("h200-sxm"))
    global_bytes = pred["bytes"]["global_read"] + pred["bytes"]["global_write"]
    p, s = problem, problem.elem_bytes
    compulsory = s * p.head_dim * (2 * p.batch * p.heads * p.seq_q
                                   + 2 * p.batch * p.kv_heads * p.seq_kv)
    dram = global_bytes if schedule == "naive" else compulsory
    return (len(pred["kernels"]), dram, global_bytes, pred["flops"]["tensor"],
            pred["flops"]["exp"])


def additive_model(problem: AttentionProblem, tiling: Tiling, schedule: str, hw,
                   compiled=None, l2_start="cold") -> dict:
    """A SYNTHETIC stand-in for the simulator whose time is a sum of one term per parameter
    (launches, DRAM, L2, tensor, exp), so that a known parameter set is recoverable
    (whatever L2 held at the start)."""
    n_kernels, dram, global_bytes, tensor, exp = _counts(problem, tiling, schedule)
    time_s = (n_kernels * hw.kernel_launch_overhead_s
              + dram / hw.hbm_effective_bytes_per_s
              + global_bytes / hw.l2_effective_bytes_per_s
              + tensor / hw.tensor_rate(problem.dtype)
              + exp / hw.exp_ops_per_s)
    return {"time_s": time_s, "legal": True,
            "bytes": {"global_read": global_bytes, "global_write": 0, "dram_read": dram,
                      "dram_write": 0}}
