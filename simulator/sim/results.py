"""From a simulation to the prediction JSON: times, DRAM bytes, achieved rates, the bound.

What bounds a kernel is read off the simulation, not guessed: over the kernel's simulated
time (launch overhead included) each resource's *utilization* is the work it did divided by
what it could have done at its achievable rate —

- ``hbm``: DRAM bytes / (effective HBM bandwidth x time);
- ``l2``: global bytes / (effective L2 bandwidth x time);
- ``tensor``, ``exp``, ``fp32``, ``smem``: busy seconds of that unit summed over SMs / (SMs x
  time) (``smem``: the shared-memory operand reads of mma.sync matmuls);

the bound is the most utilized resource if it is at least ``BOUND_UTILIZATION`` busy.
Otherwise nothing is saturated and the kernel waits: on too few resident CTAs if the SMs'
CTA slots are occupied less than ``BOUND_UTILIZATION`` of the time (``occupancy``: small
grid, tail, or launch overhead), else on latency (``latency``): of memory, or of each
CTA's own chain of dependent compute (matmul, then softmax) that too few warps per SM
overlap (``simulator.sim.compute``). The prediction's overall bound is the kernels' bound
weighted by their time.
"""

from __future__ import annotations

import numpy as np

from simulator.prediction import l2_bytes
from simulator.sim import Simulation
from simulator.sim.l2 import MISS
from simulator.sim.record import KernelRun

BOUND_UTILIZATION = 0.5


def utilization(run: KernelRun, sim: Simulation, entry: dict) -> dict[str, float]:
    hw, t = sim.hardware, np.float64(run.time_s)  # numpy float: overflow is inf, not an error
    dram = run.hbm_busy_bytes
    moved = l2_bytes(entry["bytes"])
    slot_time = float((run.cta_end - run.cta_start).sum())
    # A what-if with absurd rates (--set exp_ops_per_s=1e-300) makes rate x time overflow to
    # infinity: the utilization is then 0, without numpy's warnings on stderr.
    with np.errstate(over="ignore"):
        busy = run.unit_s / (hw.sm_count * t)
        return {
            "hbm": float(dram / (hw.hbm_effective_bytes_per_s * t)),
            "l2": float(moved / (hw.l2_effective_bytes_per_s * t)),
            "tensor": float(busy[0]),
            "exp": float(busy[1]),
            "fp32": float(busy[2]),
            "smem": float(busy[3]),
            "sm_slots": float(slot_time / (hw.sm_count * run.ctas_per_sm * t)),
        }


def bound_of(util: dict[str, float]) -> str:
    resources = {k: v for k, v in util.items() if k != "sm_slots"}
    name = max(resources, key=lambda k: resources[k])
    if resources[name] >= BOUND_UTILIZATION:
        return name
    return "occupancy" if util["sm_slots"] < BOUND_UTILIZATION else "latency"


def fill_prediction(sim: Simulation) -> dict:
    """The counts of ``count_prediction`` plus everything the simulation measured."""
    from simulator.prediction import count_prediction

    pred = count_prediction(sim.problem, sim.tiling, sim.schedule, sim.hardware, sim.compiled)
    votes: dict[str, float] = {}
    per_tensor = np.zeros((len(sim.tensor_names), 2), dtype=np.int64)
    for entry, run in zip(pred["kernels"], sim.runs, strict=True):
        t = run.time_s
        util = utilization(run, sim, entry)
        bound = bound_of(util)
        votes[bound] = votes.get(bound, 0.0) + t
        per_tensor[:, 0] += run.tensor_bytes[:, MISS]
        per_tensor[:, 1] += run.dram_write_by_tensor
        moved = l2_bytes(entry["bytes"])
        entry["time_s"] = t
        entry["bytes"]["dram_read"] = run.dram_read
        entry["bytes"]["dram_write"] = run.dram_write
        entry["bytes"]["foreign_dram_write"] = run.foreign_writeback_bytes
        # Write-backs while it ran of what earlier kernels left dirty: HBM time of its,
        # bytes of theirs (in their ``dram_write``; record.KernelRun).
        entry["bytes"]["carried_dram_write"] = run.carried_writeback_bytes
        # Of its DRAM writes, what it left dirty in L2 at its end (record.KernelRun: written
        # back while a later kernel runs, or after the last in no time the run reports).
        entry["bytes"]["left_dirty"] = run.left_dirty
        entry["achieved"] = {
            "hbm_bytes_per_s": run.hbm_bytes / t,
            "l2_bytes_per_s": moved / t,
            "tflops": entry["flops"]["tensor"] / t / 1e12,
        }
        entry["flops"]["issued"] = _issued(run.issued)
        entry["bound"] = bound
        entry["utilization"] = {k: round(v, 6) for k, v in util.items()}
        entry["occupancy"] = {
            "ctas_per_sm": run.ctas_per_sm,
            "limited_by": entry.get("residency_limited_by"),
            "resident_ctas": run.slots,
            "waves": entry["grid"] / (sim.hardware.sm_count * run.ctas_per_sm),
            "sram_peak_per_sm_bytes": run.sram_peak_per_sm(sim.hardware.sm_count),
        }
        entry["launch_s"] = run.launch_s
    total = sim.time_s
    b = pred["bytes"]
    b["dram_read"] = int(per_tensor[:, 0].sum())
    b["dram_write"] = int(per_tensor[:, 1].sum())
    # Another program's dirty data the run wrote back (``l2_start`` "dirty"): HBM time it
    # paid, bytes of none of its tensors (so not in ``dram_write``).
    b["foreign_dram_write"] = sum(r.foreign_writeback_bytes for r in sim.runs)
    pred["l2_start"] = sim.l2_start
    for i, name in enumerate(sim.tensor_names):
        pred["per_tensor"][name]["dram_read"] = int(per_tensor[i, 0])
        pred["per_tensor"][name]["dram_write"] = int(per_tensor[i, 1])
    pred["flops"]["issued"] = _issued(sum(r.issued for r in sim.runs))
    pred["time_s"] = total
    pred["bound"] = max(votes, key=lambda k: votes[k])
    pred["achieved"] = {
        "hbm_bytes_per_s": (b["dram_read"] + b["dram_write"] + b["foreign_dram_write"])
        / total,
        "l2_bytes_per_s": l2_bytes(b) / total,
        "tflops": pred["flops"]["tensor"] / total / 1e12,
        "convention_tflops": pred["flops"]["convention"] / total / 1e12,
    }
    hits = sum(r.l2_hit for r in sim.runs)
    tiles = sum(r.tile_accesses for r in sim.runs)
    pred["simulation"] = {
        "mode": sim.mode,
        "events": sim.events,
        "tile_accesses": tiles,
        "wall_s": round(sim.wall_s, 4),
        "events_per_s": sim.events / sim.wall_s if sim.wall_s > 0 else None,
        "tile_accesses_per_s": tiles / sim.wall_s if sim.wall_s > 0 else None,
        "l2_load_hit_rate": hits / b["global_read"] if b["global_read"] else None,
        "sram_peak_per_sm_bytes": max(entry["occupancy"]["sram_peak_per_sm_bytes"]
                                      for entry in pred["kernels"]),
    }
    return _plain(pred)


def _issued(work: np.ndarray) -> dict[str, int]:
    """Work the kernels issue (whole tiles, padded rows), which the simulation times; the
    counts beside it (``tensor``, ``exp``, ``other``) are of the valid elements."""
    return {unit: int(round(float(x))) for unit, x in zip(("tensor", "exp", "other"), work,
                                                          strict=True)}


def _plain(value):
    """The dict with numpy scalars turned into Python ones (JSON and callers expect those)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
