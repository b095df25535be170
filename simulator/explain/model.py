"""The one place the explainers ask the model for answers: predictions, sweeps, timelines.

Every answer comes from the timing simulator (``simulator.sim``: SimPy, with an L2 model):
``predict`` is its ``tilesim.prediction/1`` dict (times, DRAM bytes after L2, bound) with a
``model`` field naming the source; ``sweep`` predicts a small ``block_m x block_n`` grid;
``timeline`` turns one simulation's per-launch records (``KernelRun``) into CTA slices per
SM. The roofline, the report and ``tilesim simulate`` therefore show one model throughout.

Simulating is not free (naive attention at ``B=1 H=32 N=4096`` takes seconds, every tiling
of a sweep is a simulation), so callers keep their problems and grids small.
"""

from __future__ import annotations

import itertools

import numpy as np

from simulator.hardware import Hardware
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

SIMULATOR = "simulator"
SIMULATOR_NOTE = "SimPy timing simulator with L2 model"


def source() -> dict:
    """Which model answers: ``{"source": "simulator", "note": ...}``."""
    return {"source": SIMULATOR, "note": SIMULATOR_NOTE}


def unit_rates(hw: Hardware, dtype: str) -> dict:
    """Whole-chip operations per second of the tensor cores, exp units and FP32 ALUs (and bytes
    per second of shared memory, ``smem``), as the simulator's compute model has them
    (``simulator.sim.compute``: achievable tensor rate; "other" FLOPs are single non-FMA
    instructions, half the datasheet FP32 FLOP rate)."""
    from simulator.sim.compute import UNITS, sm_rates

    return dict(zip(UNITS, (float(r) * hw.sm_count for r in sm_rates(hw, dtype)), strict=True))


def compute_times_s(flops: dict, dtype: str, hw: Hardware) -> dict:
    """Seconds each compute unit needs for a kernel's ``flops`` (tensor, exp, other); a
    kernel with tensor FLOPs runs at the GPU's tensor clock (``Hardware.at_tensor_clock``),
    as the simulator times it."""
    rates = unit_rates(hw.at_tensor_clock() if flops["tensor"] else hw, dtype)
    return {"tensor": flops["tensor"] / rates["tensor"], "exp": flops["exp"] / rates["exp"],
            "fp32": flops["other"] / rates["fp32"]}


def dram_bytes(byte_counts: dict) -> int:
    """DRAM read + write of a prediction's (or kernel's) ``bytes``."""
    return int(byte_counts["dram_read"]) + int(byte_counts["dram_write"])


def _simulate(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
              compiled=None, l2_start: str = "cold", profiled: bool = False):
    """``(prediction dict with "model", Simulation)``; ``ProblemError`` if it cannot run."""
    from simulator import sim

    pred, simulation = sim.predict_as_timed(problem, tiling, schedule, hw, compiled,
                                            l2_start, profiled)
    pred["model"] = source()
    return pred, simulation


def predict(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
            compiled=None, l2_start: str = "cold", profiled: bool = False) -> dict:
    """The simulator's prediction dict (``tilesim.prediction/1``) plus ``model``
    (``compiled``, ``l2_start`` and ``profiled`` as ``simulator.sim.predict_as_timed``;
    records are reconciled with ``profiled``, as ``validation.predict.predict`` does)."""
    return _simulate(problem, tiling, schedule, hw, compiled, l2_start, profiled)[0]


def predict_profiled(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
                     compiled=None, l2_start: str = "cold") -> dict:
    """``predict`` as reconciliation asks for it: with ``profiled`` (a module-level
    function, so that ``validation.predict.map_tasks`` can send it to other processes)."""
    return predict(problem, tiling, schedule, hw, compiled, l2_start, profiled=True)


PAIR = ("naive", "fa2")


def predict_pair(problem: AttentionProblem, tiling: Tiling, hw: Hardware,
                 compiled: dict | None = None) -> dict:
    """Naive attention's and FlashAttention-2's predictions (``PAIR`` order); ``compiled``
    maps a schedule to its kernels' compiled resources, where given.

    Naive attention's S and P outgrow device memory long before FlashAttention's tensors
    do. Then naive keeps its exact counts, untimed (``time_s`` and its DRAM bytes ``None``,
    ``legal`` false), and ``"note"`` says why: that it cannot run at all is the comparison's
    point. If FlashAttention does not fit either, ``DeviceMemoryError`` as ``predict``,
    before naive attention is counted (its tiles alone may outgrow the host's memory).
    """
    from simulator.device_memory import DeviceMemoryError
    from simulator.prediction import count_prediction

    preds = {}
    for name in reversed(PAIR):  # FlashAttention first: it decides whether to go on
        try:
            preds[name] = predict(problem, tiling, name, hw, (compiled or {}).get(name))
        except DeviceMemoryError as exc:
            if name != "naive":
                raise
            preds[name] = count_prediction(problem, tiling, name, hw,
                                           (compiled or {}).get(name))
            preds[name]["model"] = source()
            preds[name]["note"] = str(exc)
    return {name: preds[name] for name in PAIR}


def timed(pred: dict) -> bool:
    """Whether the prediction was simulated (``predict_pair`` may only count one)."""
    return pred["time_s"] is not None


SWEEP_BLOCKS = (32, 64, 128, 256)
TIE = 0.01  # tilings predicted within this fraction of the best are ties
OPERAND_CAVEAT = ("the model does not charge wgmma's operand reads from shared memory, which "
                  "may slow small block_n down (docs/model.md: what the model leaves out)")


def ties_differ_in_block_n(entries: list[tuple[int, float, str]]) -> bool:
    """Whether the tensor-bound tilings tied with the best (``TIE``) differ in block_n:
    there the model leaves out the mechanism that would tell them apart (``OPERAND_CAVEAT``).
    ``entries`` are ``(block_n, time_s, bound)`` of the tilings that ran."""
    if not entries:
        return False
    best = min(t for _, t, _ in entries)
    return len({bn for bn, t, bound in entries
                if t <= best * (1 + TIE) and bound == "tensor"}) > 1


def sweep(problem: AttentionProblem, base: Tiling, schedule: str, hw: Hardware,
          block_ms: tuple[int, ...] = SWEEP_BLOCKS,
          block_ns: tuple[int, ...] = SWEEP_BLOCKS, compiled_of=None) -> dict:
    """Simulated time over ``block_m x block_n`` (stages and warps from ``base``);
    ``compiled_of(tiling)``: the compiled resources of a tiling's kernels, where given (a
    ``ProblemError`` from it refuses the tiling).

    Returns ``{"model", "block_m", "block_n", "cells": [...], "best", "resources"}``
    (``resources``: where the kernels' registers came from, ``prediction.resources_source``
    of every kernel of every cell that ran); a cell is
    ``{"block_m", "block_n", "legal", "time_s", "dram_bytes", "bound", "sram_bytes_per_cta",
    "ctas_per_sm"}`` with ``time_s`` None where the tiling is refused.
    """
    cells, sources = [], set()
    for bm, bn in itertools.product(block_ms, block_ns):
        tiling = Tiling(block_m=bm, block_n=bn, num_stages=base.num_stages,
                        num_warps=base.num_warps, split_kv=base.split_kv)
        cell = {"block_m": bm, "block_n": bn, "legal": False, "time_s": None,
                "dram_bytes": None, "bound": None, "sram_bytes_per_cta": None,
                "ctas_per_sm": 0, "reason": None}
        try:
            pred = predict(problem, tiling, schedule, hw,
                           compiled_of(tiling) if compiled_of else None)
        except ProblemError as exc:  # refused by the simulator (e.g. does not fit SRAM)
            cell["reason"] = str(exc)
            cells.append(cell)
            continue
        cell["sram_bytes_per_cta"] = pred["sram_peak_bytes_per_cta"]
        cell["ctas_per_sm"] = pred["ctas_per_sm"]
        sources.update(k["resources"] for k in pred["kernels"])
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
            "num_warps": base.num_warps, "cells": cells, "best": best,
            "resources": sorted(sources)}


def timeline(problem: AttentionProblem, tiling: Tiling, schedule: str, hw: Hardware,
             compiled=None) -> dict:
    """CTA slices per SM of one simulation: ``{"model", "schedule", "tiling", "time_s",
    "sm_count", "kernels", "slices"}`` (``compiled`` as ``predict``'s).

    ``slices`` holds one columnar entry per kernel, ``{"kernel", "sm", "lane", "start_s",
    "dur_s"}`` (lists indexed by CTA in launch order); ``lane`` is the CTA's slot within its
    SM (0 .. ctas_per_sm - 1).
    """
    pred, simulation = _simulate(problem, tiling, schedule, hw, compiled)
    kernels, slices = slices_from_kernel_runs(simulation.runs, hw.sm_count)
    return {"model": source(), "schedule": schedule, "tiling": tiling.to_dict(),
            "time_s": pred["time_s"], "sm_count": hw.sm_count, "kernels": kernels,
            "slices": slices}


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
