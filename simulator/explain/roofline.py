"""The roofline gauge: where each kernel of naive and FA2 attention sits against a GPU's roofs.

A kernel doing ``W`` FLOPs and moving ``D`` DRAM bytes has arithmetic intensity ``I = W / D``.
On a GPU with peak ``P`` FLOP/s and HBM bandwidth ``B`` bytes/s it can reach at most
``min(P, I * B)``; the ridge point ``P / B`` is the intensity where the two roofs meet —
left of it a kernel is memory-bound, right of it compute-bound.

What is counted:

- ``W`` is all arithmetic of the kernel: tensor-core FLOPs + exps + other FLOPs (so the
  softmax kernel of naive attention, which has no tensor work, still has a place).
- ``D`` is DRAM read + write from the timing simulator (``simulator.explain.model``: global
  loads and stores after its L2 model).
- Roofs come from the preset: the tensor-core peak of the problem's dtype and the HBM
  bandwidth as datasheet numbers (the ridge point the datasheet implies) and as achievable
  numbers (times the preset's efficiencies: what the model uses).
- The exp unit is its own ceiling. It runs ``E`` exps/s, so a kernel that does ``F`` FLOPs per
  exp cannot exceed ``E * F`` FLOP/s, however fast its tensor cores are. It is drawn as a
  horizontal line at ``E * F`` with ``F`` = the FA2 schedule's FLOPs per exp for this
  problem (``~4d`` forward: ``2d`` for ``QK^T`` and ``2d`` for ``PV`` per score); when that
  line lies below the tensor peak the exp unit, not the tensor cores, is the compute roof.
- Each kernel's own compute ceiling is ``W / T`` with the simulator's unit times
  (``tensor/P``, ``exps/E``, ``other/F``: achievable tensor rate; ``F`` = half the datasheet
  FP32 rate, as "other" FLOPs are not FMAs) combined as the simulator does: ``T`` is the
  busiest unit's time plus ``1 - unit_overlap`` of the others' (``simulator.sim.compute``;
  the busiest unit is the one named as the bound). The roofline takes every matmul at the
  wgmma rate and leaves out the shared-memory traffic the simulator charges mma.sync
  kernels (operand reads, tile staging and the tiles' global loads and stores through the
  same pipe) and the work a warp layout repeats
  (``traces.schedules.mma_layout``), so for small tiles, and tiles with fewer rows than
  their warps cover, the simulated rate sits further below its ceiling. Its attainable
  rate is ``W / max(that compute time, D / B)``; its utilisation is the tensor-core FLOP/s
  it reaches at that bound as a fraction of the datasheet peak.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from simulator.explain import model
from simulator.explain.common import fmt_bytes, fmt_flops, new_figure, save_figure
from simulator.hardware import Hardware
from simulator.sim.compute import busy_seconds
from traces.problem import AttentionProblem
from traces.tiling import Tiling

SCHEMA = "tilesim.roofline/1"


def kernel_flops(kernel: dict) -> int:
    """All arithmetic of a kernel: tensor FLOPs + exps + other FLOPs."""
    f = kernel["flops"]
    return int(f["tensor"]) + int(f["exp"]) + int(f["other"])


def ceilings(hw: Hardware, dtype: str, flops_per_exp: float) -> dict:
    """The roofs of ``hw`` for ``dtype`` and their ridge points (FLOP per DRAM byte)."""
    peak = float(hw.tensor_flops_per_s[dtype])
    bw = float(hw.hbm_bandwidth_bytes_per_s)
    exp_ceiling = hw.exp_ops_per_s * flops_per_exp
    return {
        "tensor_flops_per_s": peak,
        "tensor_achievable_flops_per_s": hw.tensor_rate(dtype),
        "hbm_bytes_per_s": bw,
        "hbm_achievable_bytes_per_s": hw.hbm_effective_bytes_per_s,
        "exp_ops_per_s": float(hw.exp_ops_per_s),
        "flops_per_exp": flops_per_exp,
        "exp_ceiling_flops_per_s": exp_ceiling,
        "fp32_flops_per_s": float(hw.fp32_flops_per_s),
        "ridge_points": {
            "tensor": peak / bw,
            "tensor_achievable": hw.tensor_rate(dtype) / hw.hbm_effective_bytes_per_s,
            "exp": exp_ceiling / bw,
            "fp32": hw.fp32_flops_per_s / bw,
        },
    }


def place_kernel(kernel: dict, schedule: str, dtype: str, hw: Hardware) -> dict:
    """One kernel on the roofline: intensity, ceilings, attainable rate, bound, utilisation."""
    flops, dram = kernel_flops(kernel), model.dram_bytes(kernel["bytes"])
    global_bytes = kernel["bytes"]["global_read"] + kernel["bytes"]["global_write"]
    f = kernel["flops"]
    compute_times = model.compute_times_s(f, dtype, hw)
    compute_unit = max(compute_times, key=lambda k: compute_times[k])
    compute_s = float(busy_seconds(np.array(list(compute_times.values())), hw))
    memory_s = dram / hw.hbm_effective_bytes_per_s
    bound_s, bound = max((memory_s, "hbm"), (compute_s, compute_unit))
    model_s = kernel.get("time_s")
    return {
        "schedule": schedule,
        "name": kernel["name"],
        "grid": kernel["grid"],
        "flops": flops,
        "tensor_flops": int(f["tensor"]),
        "exp_ops": int(f["exp"]),
        "other_flops": int(f["other"]),
        "dram_bytes": dram,
        "global_bytes": global_bytes,
        "intensity": flops / dram if dram else None,
        "global_intensity": flops / global_bytes if global_bytes else None,
        "compute_ceiling_flops_per_s": flops / compute_s if compute_s else None,
        "compute_unit": compute_unit,
        "memory_ceiling_flops_per_s": flops / memory_s if memory_s else None,
        "attainable_flops_per_s": flops / bound_s if bound_s else None,
        "bound": bound,
        "time_bound_s": bound_s,
        "tensor_utilisation": (f["tensor"] / bound_s / hw.tensor_flops_per_s[dtype]
                               if bound_s else 0.0),
        "hbm_utilisation": dram / bound_s / hw.hbm_bandwidth_bytes_per_s if bound_s else 0.0,
        "model_time_s": model_s,
        "model_flops_per_s": flops / model_s if model_s else None,
    }


def roofline(problem: AttentionProblem, tiling: Tiling, hw: Hardware,
             preds: dict | None = None) -> dict:
    """The roofline of ``hw`` for the problem's dtype, with every naive and FA2 kernel on it.

    ``preds`` (schedule -> prediction, as ``model.predict_pair`` returns them) saves
    predicting again when the caller already has them. A schedule that was only counted
    (naive attention whose tensors do not fit in device memory) has no DRAM bytes, so no
    place: its entry in ``schedules`` keeps its FLOPs and the ``note`` that says why.
    """
    if preds is None:
        preds = model.predict_pair(problem, tiling, hw)
    preds = {name: preds[name] for name in model.PAIR}
    fa2 = preds["fa2"]["flops"]
    fa2_flops = fa2["tensor"] + fa2["exp"] + fa2["other"]
    flops_per_exp = fa2_flops / fa2["exp"] if fa2["exp"] else 0.0
    kernels = [place_kernel(k, name, problem.dtype, hw)
               for name, pred in preds.items() if model.timed(pred) for k in pred["kernels"]]
    schedules = {}
    for name, pred in preds.items():
        if not model.timed(pred):
            schedules[name] = {"kernels": [], "flops": sum(kernel_flops(k)
                                                           for k in pred["kernels"]),
                               "dram_bytes": None, "intensity": None, "time_bound_s": None,
                               "time_s": None, "bound": None, "note": pred.get("note")}
            continue
        mine = [k for k in kernels if k["schedule"] == name]
        flops = sum(k["flops"] for k in mine)
        dram = model.dram_bytes(pred["bytes"])
        schedules[name] = {
            "kernels": [k["name"] for k in mine],
            "flops": flops,
            "dram_bytes": dram,
            "intensity": flops / dram if dram else None,
            "time_bound_s": sum(k["time_bound_s"] for k in mine),
            "time_s": pred["time_s"],
            "bound": pred["bound"],
        }
    return {
        "schema": SCHEMA,
        "hardware": {"name": hw.name, "display_name": hw.display_name},
        "dtype": problem.dtype,
        "problem": problem.to_dict(),
        "tiling": tiling.to_dict(),
        "model": model.source(),
        "flops_counted": "tensor-core FLOPs + exps + other FLOPs",
        "ceilings": ceilings(hw, problem.dtype, flops_per_exp),
        "kernels": kernels,
        "schedules": schedules,
    }


def fmt_rate(flops_per_s: float | None) -> str:
    return "-" if flops_per_s is None else f"{flops_per_s / 1e12:,.1f} TFLOP/s"


def notes(result: dict) -> list[str]:
    """The sentences that explain the gauge (shared by the terminal and the report)."""
    c = result["ceilings"]
    r = c["ridge_points"]
    exp_vs = ("below the tensor peak: for this problem the exp unit, not the tensor cores, "
              "is the compute roof" if c["exp_ceiling_flops_per_s"] < c["tensor_flops_per_s"]
              else "above the tensor peak: the tensor cores are the compute roof")
    lines = [
        f"Ridge point {r['tensor']:.0f} FLOP/B = {c['tensor_flops_per_s'] / 1e12:.0f} TFLOP/s "
        f"{result['dtype']} / {c['hbm_bytes_per_s'] / 1e12:.2f} TB/s (datasheet); "
        f"{r['tensor_achievable']:.0f} FLOP/B with the preset's efficiencies.",
        f"Exp ceiling: {c['exp_ops_per_s'] / 1e12:.2f} T exp/s x {c['flops_per_exp']:.0f} FLOPs "
        f"per exp (FA2 on this problem) = {fmt_rate(c['exp_ceiling_flops_per_s'])}, {exp_vs}.",
        f"FLOPs counted: {result['flops_counted']}; bytes: DRAM read + write.",
    ]
    lines += [f"{name}: not placed, {entry['note']}." for name, entry in
              result["schedules"].items() if entry.get("note")]
    return lines


def render(result: dict) -> Group:
    """Ceilings, then one row per kernel, then the notes."""
    c = result["ceilings"]
    roofs = Table(title=f"Roofline — {result['hardware']['display_name']}, {result['dtype']}",
                  title_justify="left")
    for col in ("roof", "datasheet", "achievable", "ridge (FLOP/B)"):
        roofs.add_column(col, justify="left" if col == "roof" else "right")
    r = c["ridge_points"]
    roofs.add_row("tensor cores", fmt_rate(c["tensor_flops_per_s"]),
                  fmt_rate(c["tensor_achievable_flops_per_s"]),
                  f"{r['tensor']:.1f} / {r['tensor_achievable']:.1f}")
    roofs.add_row("HBM", f"{c['hbm_bytes_per_s'] / 1e12:.2f} TB/s",
                  f"{c['hbm_achievable_bytes_per_s'] / 1e12:.2f} TB/s", "")
    roofs.add_row(f"exp unit (x{c['flops_per_exp']:.0f} FLOP/exp)",
                  fmt_rate(c["exp_ceiling_flops_per_s"]), "", f"{r['exp']:.1f}")
    roofs.add_row("fp32 ALUs", fmt_rate(c["fp32_flops_per_s"]), "", f"{r['fp32']:.1f}")

    table = Table(title="kernels (intensity = FLOPs / DRAM bytes)", title_justify="left")
    for col in ("schedule", "kernel", "FLOPs", "DRAM bytes", "FLOP/B", "attainable", "bound",
                "tensor util.", "model time"):
        table.add_column(col, justify="left" if col in ("schedule", "kernel") else "right")
    for k in result["kernels"]:
        table.add_row(
            k["schedule"], k["name"], fmt_flops(k["flops"]), fmt_bytes(k["dram_bytes"]),
            f"{k['intensity']:.1f}" if k["intensity"] is not None else "-",
            fmt_rate(k["attainable_flops_per_s"]), k["bound"],
            f"{k['tensor_utilisation']:.0%}",
            f"{k['model_time_s'] * 1e3:.3f} ms" if k["model_time_s"] is not None else "-",
        )
    return Group(roofs, table, Text("\n".join(notes(result)), style="dim"))


def print_render(result: dict) -> None:
    """Print ``render(result)``; off a terminal, wide enough that the table does not wrap."""
    from simulator.cli.common import output_console

    output_console().print(render(result))


COLORS = {"naive": "#c0392b", "fa2": "#1f6fb2"}
MARKERS = "osD^v<>p"


def plot(result: dict, path: str | Path) -> None:
    """Log-log roofline: roofs (datasheet solid, achievable dashed), exp and fp32 ceilings,
    and every kernel at its intensity and attainable rate."""
    import numpy as np

    c = result["ceilings"]
    placed = [k for k in result["kernels"] if k["intensity"]]
    xs = [k["intensity"] for k in placed] + [c["ridge_points"]["tensor"]]
    lo, hi = min(xs) / 4, max(xs) * 4
    x = np.geomspace(lo, hi, 400)
    fig = new_figure(8, 5.2)
    ax = fig.subplots()
    peak, bw = c["tensor_flops_per_s"], c["hbm_bytes_per_s"]
    ax.loglog(x, np.minimum(peak, x * bw), color="0.15", lw=2,
              label=f"roofline (datasheet): {peak / 1e12:.0f} TFLOP/s, {bw / 1e12:.2f} TB/s")
    ax.loglog(x, np.minimum(c["tensor_achievable_flops_per_s"],
                            x * c["hbm_achievable_bytes_per_s"]),
              "--", color="0.45", lw=1.2, label="achievable (preset efficiencies)")
    ax.axhline(c["exp_ceiling_flops_per_s"], color="#e67e22", ls=":", lw=1.6,
               label=f"exp unit x {c['flops_per_exp']:.0f} FLOP/exp")
    ax.axhline(c["fp32_flops_per_s"], color="#7f8c8d", ls="-.", lw=1, label="fp32 ALUs")
    ridge = c["ridge_points"]["tensor"]
    ax.axvline(ridge, color="0.6", lw=0.8)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 0), xycoords=("data", "axes fraction"),
                textcoords="offset points", xytext=(4, 6), fontsize=8, color="0.3")
    for i, k in enumerate(placed):
        ax.loglog(k["intensity"], k["attainable_flops_per_s"], MARKERS[i % len(MARKERS)],
                  color=COLORS.get(k["schedule"], "C2"), ms=8,
                  label=f"{k['name']}: {k['bound']}-bound, "
                        f"{k['tensor_utilisation']:.0%} tensor")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity, FLOPs per DRAM byte")
    ax.set_ylabel("attainable FLOP/s")
    p = result["problem"]
    ax.set_title(f"{result['hardware']['display_name']}, {result['dtype']} — "
                 f"N={p['seq_q']} d={p['head_dim']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7.5, loc="lower right")
    save_figure(fig, path)
