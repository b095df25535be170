"""The one place the explainers ask the model for answers: predictions, sweeps, timelines.

The roofline and the report need DRAM bytes and times. The timing simulator
(``simulator.sim``, SimPy, with an L2 model) gives them; while it is not installed in this
tree, every answer falls back to the exact counts of ``count_prediction`` with two stated
stand-ins, and says so in its ``model`` field:

- DRAM bytes := global bytes (no L2 model: every global load is charged to HBM, so re-reads
  that a real GPU serves from L2 are counted as DRAM traffic — an upper bound);
- time := the roofline bound of each kernel, ``max(DRAM bytes / achievable HBM bandwidth,
  tensor FLOPs / achievable tensor rate, exps / exp rate, other FLOPs / FP32 rate)`` with the
  simulator's unit rates (``unit_rates``), plus the launch overhead (a lower bound on what
  the simulator reports).

The fallback timeline places each kernel's CTAs, in launch order, on the first free SM slot
(``ctas_per_sm`` slots per SM), each CTA lasting in proportion to its loop iterations, and
scales the whole to the kernel's bound time — the wave picture, not a simulation.
"""

from __future__ import annotations

import heapq
import importlib
import inspect
import itertools
import re

import numpy as np

from simulator.hardware import Hardware
from simulator.prediction import count_prediction
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

SIMULATOR = "simulator"
FALLBACK = "count+roofline"
FALLBACK_NOTE = (
    "timing simulator not available: DRAM bytes = global bytes (no L2 model), "
    "time = per-kernel roofline bound + launch overhead"
)


def _sim_module():
    """``simulator.sim`` if it is installed and exposes ``simulate``; else None."""
    try:
        module = importlib.import_module("simulator.sim")
    except ImportError:
        return None
    return module if callable(getattr(module, "simulate", None)) else None


def source() -> dict:
    """Which model answers: ``{"source": "simulator" | "count+roofline", "note": ...}``."""
    if _sim_module() is not None:
        return {"source": SIMULATOR, "note": "SimPy timing simulator with L2 model"}
    return {"source": FALLBACK, "note": FALLBACK_NOTE}


def unit_rates(hw: Hardware, dtype: str) -> dict:
    """Whole-chip operations per second of the tensor cores, exp units and FP32 ALUs, as the
    simulator's compute model has them (``simulator.sim.compute``: achievable tensor rate;
    "other" FLOPs are single non-FMA instructions, half the datasheet FP32 FLOP rate)."""
    from simulator.sim.compute import UNITS, sm_rates

    return dict(zip(UNITS, (float(r) * hw.sm_count for r in sm_rates(hw, dtype)), strict=True))


def compute_times_s(flops: dict, dtype: str, hw: Hardware) -> dict:
    """Seconds each compute unit needs for a kernel's ``flops`` (tensor, exp, other)."""
    rates = unit_rates(hw, dtype)
    return {"tensor": flops["tensor"] / rates["tensor"], "exp": flops["exp"] / rates["exp"],
            "fp32": flops["other"] / rates["fp32"]}


def kernel_bound_time_s(kernel: dict, dtype: str, hw: Hardware) -> tuple[float, str]:
    """The roofline bound of one kernel (without launch overhead) and the unit that sets it."""
    times = {"hbm": dram_bytes(kernel["bytes"]) / hw.hbm_effective_bytes_per_s,
             **compute_times_s(kernel["flops"], dtype, hw)}
    unit = max(times, key=lambda k: times[k])
    return times[unit], unit


def dram_bytes(byte_counts: dict) -> int:
    """DRAM read + write of a prediction's (or kernel's) ``bytes``."""
    return int(byte_counts["dram_read"]) + int(byte_counts["dram_write"])


def _fallback(pred: dict, dtype: str, hw: Hardware) -> dict:
    """Fill DRAM bytes with global bytes and times with roofline bounds (see the docstring)."""
    total, bound_time = 0.0, -1.0
    for k in pred["kernels"]:
        k["bytes"]["dram_read"] = k["bytes"]["global_read"]
        k["bytes"]["dram_write"] = k["bytes"]["global_write"]
        t, unit = kernel_bound_time_s(k, dtype, hw)
        k["time_s"] = t + hw.kernel_launch_overhead_s
        k["bound"] = unit
        total += k["time_s"]
        if t > bound_time:
            bound_time, pred["bound"] = t, unit
    pred["time_s"] = total
    pred["bytes"]["dram_read"] = pred["bytes"]["global_read"]
    pred["bytes"]["dram_write"] = pred["bytes"]["global_write"]
    for entry in pred["per_tensor"].values():
        entry["dram_read"], entry["dram_write"] = entry["global_read"], entry["global_write"]
    return pred


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware) -> dict:
    """The prediction dict (DESIGN schema) with ``time_s``, DRAM bytes and ``bound`` filled."""
    sim = _sim_module()
    if sim is not None:
        pred = sim.simulate(problem, tiling, schedule, hw)
    else:
        pred = _fallback(count_prediction(problem, tiling, schedule, hw), problem.dtype, hw)
    pred["model"] = source()
    return pred


SWEEP_BLOCKS = (32, 64, 128, 256)


def sweep(problem: AttentionProblem, base: Tiling, schedule: str, hw: Hardware,
          block_ms: tuple[int, ...] = SWEEP_BLOCKS,
          block_ns: tuple[int, ...] = SWEEP_BLOCKS) -> dict:
    """Predicted time over ``block_m x block_n`` (stages and warps from ``base``).

    Returns ``{"model", "block_m", "block_n", "cells": [...], "best"}``; a cell is
    ``{"block_m", "block_n", "legal", "time_s", "dram_bytes", "bound", "sram_bytes_per_cta",
    "ctas_per_sm"}`` with ``time_s`` None where the tiling is refused.
    """
    cells = []
    for bm, bn in itertools.product(block_ms, block_ns):
        tiling = Tiling(block_m=bm, block_n=bn, num_stages=base.num_stages,
                        num_warps=base.num_warps, split_kv=base.split_kv)
        cell = {"block_m": bm, "block_n": bn, "legal": False, "time_s": None,
                "dram_bytes": None, "bound": None, "sram_bytes_per_cta": None,
                "ctas_per_sm": 0, "reason": None}
        try:
            pred = predict(problem, tiling, schedule, hw)
        except ProblemError as exc:  # refused by the model (e.g. does not fit SRAM)
            cell["reason"] = str(exc)
            cells.append(cell)
            continue
        cell["sram_bytes_per_cta"] = pred["sram_peak_bytes_per_cta"]
        cell["ctas_per_sm"] = pred["ctas_per_sm"]
        if pred["legal"]:
            cell.update(legal=True, time_s=pred["time_s"], dram_bytes=dram_bytes(pred["bytes"]),
                        bound=pred["bound"])
        else:
            cell["reason"] = "a CTA does not fit in one SM"
        cells.append(cell)
    legal = [c for c in cells if c["legal"]]
    best = min(legal, key=lambda c: c["time_s"]) if legal else None
    return {"model": source(), "schedule": schedule, "block_m": list(block_ms),
            "block_n": list(block_ns), "num_stages": base.num_stages,
            "num_warps": base.num_warps, "cells": cells, "best": best}


def timeline(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware) -> dict:
    """CTA slices per SM for one run: ``{"model", "time_s", "sm_count", "kernels", "slices"}``.

    ``slices`` holds one columnar entry per kernel, ``{"kernel", "sm", "lane", "start_s",
    "dur_s"}`` (lists indexed by CTA in launch order); ``lane`` is the CTA's slot within its
    SM (0 .. ctas_per_sm - 1). From the simulator's own timeline when it records one
    (``simulate(..., timeline=True)`` returning, under ``"timeline"``, its per-launch
    records or Chrome trace events), else the wave picture of the module docstring.
    """
    sim = _sim_module()
    if sim is not None and "timeline" in inspect.signature(sim.simulate).parameters:
        pred = sim.simulate(problem, tiling, schedule, hw, timeline=True)
        recorded = pred.pop("timeline", None)
        if isinstance(recorded, dict):
            recorded = recorded.get("traceEvents")
        if recorded:
            kernels, slices = (slices_from_kernel_runs(recorded, hw.sm_count)
                               if hasattr(recorded[0], "cta_slot")
                               else slices_from_chrome_trace(recorded))
            return {"model": source(), "schedule": schedule, "tiling": tiling.to_dict(),
                    "time_s": pred["time_s"], "sm_count": hw.sm_count, "kernels": kernels,
                    "slices": slices}
    return _wave_timeline(problem, tiling, schedule, hw)


def slices_from_kernel_runs(runs: list, sm_count: int) -> tuple[list[dict], list[dict]]:
    """Kernels and CTA slices from the simulator's per-launch records (``KernelRun``-like:
    ``name, launch_s, end_s, ctas_per_sm, cta_start, cta_end, cta_slot``; slot ``s`` is on
    SM ``s % sm_count``)."""
    kernels, slices = [], []
    for i, run in enumerate(runs):
        slot = np.asarray(run.cta_slot, dtype=np.int64)
        start = np.asarray(run.cta_start, dtype=np.float64)
        kernels.append({"name": run.name, "start_s": float(run.launch_s),
                        "time_s": float(run.end_s - run.launch_s), "grid": len(slot),
                        "ctas_per_sm": int(run.ctas_per_sm)})
        slices.append({"kernel": i, "sm": (slot % sm_count).tolist(),
                       "lane": (slot // sm_count).tolist(), "start_s": start.tolist(),
                       "dur_s": (np.asarray(run.cta_end) - start).tolist()})
    return kernels, slices


def slices_from_chrome_trace(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """Kernels and per-kernel CTA slices from Chrome Trace Event dicts.

    Complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds) on tracks named
    ``SM <n>`` (``thread_name`` metadata; without it the ``tid`` is the SM) are CTAs; the
    kernel is ``args.kernel``, else the category. Overlapping CTAs of one SM get lanes.
    """
    names = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", ""))
             for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    ctas = []
    for e in events:
        if e.get("ph") != "X":
            continue
        track = names.get((e.get("pid"), e.get("tid")))
        match = re.search(r"SM\s*(\d+)", track) if track is not None else None
        if track is not None and match is None:
            continue  # a counter or other track, not an SM
        sm = int(match.group(1)) if match else int(e.get("tid", 0))
        kernel = str((e.get("args") or {}).get("kernel") or e.get("cat") or "kernel")
        ctas.append((e["ts"] * 1e-6, e["dur"] * 1e-6, sm, kernel))
    ctas.sort(key=lambda c: (c[0], c[2]))
    order = list(dict.fromkeys(c[3] for c in ctas))
    lanes_free: dict[int, list[float]] = {}  # per SM: when each lane frees up
    slices = [{"kernel": i, "sm": [], "lane": [], "start_s": [], "dur_s": []}
              for i in range(len(order))]
    for start, dur, sm, kernel in ctas:
        free = lanes_free.setdefault(sm, [])
        lane = next((i for i, t in enumerate(free) if t <= start), len(free))
        if lane == len(free):
            free.append(0.0)
        free[lane] = start + dur
        s = slices[order.index(kernel)]
        s["sm"].append(sm)
        s["lane"].append(lane)
        s["start_s"].append(start)
        s["dur_s"].append(dur)
    kernels = []
    for name, s in zip(order, slices, strict=True):
        begin = min(s["start_s"])
        end = max(a + b for a, b in zip(s["start_s"], s["dur_s"], strict=True))
        kernels.append({"name": name, "start_s": begin, "time_s": end - begin,
                        "grid": len(s["sm"]), "ctas_per_sm": max(s["lane"]) + 1})
    return kernels, slices


def _wave_timeline(problem: AttentionProblem, tiling: Tiling, schedule: str,
                   hw: Hardware) -> dict:
    from traces.schedules import build_schedule

    pred = predict(problem, tiling, schedule, hw)
    sched = build_schedule(problem, tiling, schedule)
    slices, kernels, start = [], [], 0.0
    for kernel, entry in zip(sched.kernels, pred["kernels"], strict=True):
        per_sm = max(int(entry["ctas_per_sm"]), 1)
        work = kernel.loop_count.astype(np.float64) + 1.0  # a CTA's prologue/epilogue ~ 1 step
        sm, lane, t0, dur = _list_schedule(work, hw.sm_count, per_sm)
        span = float((t0 + dur).max()) if len(dur) else 1.0
        scale = max(entry["time_s"] - hw.kernel_launch_overhead_s, 0.0) / span
        begin = start + hw.kernel_launch_overhead_s
        kernels.append({"name": entry["name"], "start_s": start, "time_s": entry["time_s"],
                        "grid": entry["grid"], "ctas_per_sm": per_sm})
        slices.append({"kernel": len(kernels) - 1, "sm": sm.tolist(), "lane": lane.tolist(),
                       "start_s": (begin + t0 * scale).tolist(),
                       "dur_s": (dur * scale).tolist()})
        start += entry["time_s"]
    return {"model": source(), "schedule": schedule, "tiling": tiling.to_dict(),
            "time_s": pred["time_s"], "sm_count": hw.sm_count, "kernels": kernels,
            "slices": slices}


def _list_schedule(work: np.ndarray, sm_count: int, per_sm: int):
    """Greedy dispatch in launch order to the earliest free slot (ties: lowest SM, lane)."""
    # NOTE: a heap of (free_at, slot) keeps this O(grid log slots) for grids of 10^5 CTAs.
    slots = [(0.0, lane * sm_count + sm) for lane in range(per_sm) for sm in range(sm_count)]
    heapq.heapify(slots)
    n = len(work)
    slot_of = np.empty(n, dtype=np.int64)
    t0 = np.empty(n)
    for i, w in enumerate(work):
        free_at, slot = heapq.heappop(slots)
        slot_of[i], t0[i] = slot, free_at
        heapq.heappush(slots, (free_at + w, slot))
    return slot_of % sm_count, slot_of // sm_count, t0, work.copy()
