"""The prediction: one JSON-ready dict per (problem, tiling, schedule, hardware).

Schema ``tilesim.prediction/1`` (see DESIGN.md). ``count_prediction`` fills the exact
counts (closed form) and leaves the cache- and time-dependent fields ``None``; the timing
simulator fills those in.

SRAM traffic is modelled as: every byte a CTA loads from global memory is written into
shared memory once and read from it once by the compute (``smem_write = smem_read =
global_read``); outputs are stored from registers. A kernel whose compile spills registers
in its loop also moves ``local_read`` and ``local_write`` bytes through L2: the reloads that
miss L1 and the stores (``simulator.spills``; 0 where no compile is given).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from simulator import device_memory
from simulator.counting import KernelCount, closed_form
from simulator.hardware import Hardware
from simulator.occupancy import kernel_residency
from traces.problem import AttentionProblem
from traces.schedules import build_schedule, check_supported
from traces.tiling import Tiling

SCHEMA = "tilesim.prediction/1"


def tool_version() -> str:
    try:
        return version("tilesim")
    except PackageNotFoundError:  # running from a source tree without install
        return "0.1.0+source"


def warp_layout(kernel, num_warps: int, elem_bytes: int, hw: Hardware) -> dict | None:
    """How the compiler lays ``kernel``'s warps over its matmuls (``mma_layout``): the
    instruction, each matmul's ``MxN:WMxWN`` in program order, and the copies of its tensor
    and elementwise work that layout computes (1 where nothing is repeated); None for a
    kernel without matmuls."""
    from simulator.sim.compute import uses_wgmma
    from traces.schedules.mma_layout import layout_label, layouts, matmul_costs

    if not kernel.dots:
        return None
    dots = list(kernel.dots)
    wgmma = uses_wgmma(hw, kernel.mma_rows, num_warps)
    costs = matmul_costs(dots, num_warps, elem_bytes, wgmma)
    return {"instruction": "wgmma" if wgmma else "mma.sync",
            "matmuls": [layout_label(d.m, d.n, layout)
                        for d, layout in zip(dots, layouts(dots, num_warps, wgmma),
                                             strict=True)],
            "copies": {"tensor": costs.tensor_scale,
                       "elementwise": costs.elementwise_scale}}


def tile_copies(pred: dict) -> int:
    """The most times any kernel of ``pred`` computes one of its tiles (``warp_layout``'s
    elementwise copies); 1 where nothing is repeated."""
    return max([int(k["warp_layout"]["copies"]["elementwise"]) for k in pred["kernels"]
                if k.get("warp_layout")] or [1])


def _kernel_entry(count: KernelCount, res, resources: str, layout: dict | None,
                  given=None, local: tuple[int, int] = (0, 0)) -> dict:
    """One kernel's entry; ``given``: its compile's ``CompiledResources``, whose spills per
    main-loop iteration it reports (the bytes a thread spills and reloads, the times a warp
    waits for the reloads) and the instructions a warp issues per iteration, or in all in a
    kernel without loops (None: not known); ``local``: the bytes its spills read from L2
    and write to it (``local_bytes``)."""
    read, write = sum(count.reads.values()), sum(count.writes.values())
    return {
        "name": count.name,
        "grid": count.grid,
        "time_s": None,
        "bytes": {"global_read": read, "global_write": write,
                  "local_read": local[0], "local_write": local[1],
                  "dram_read": None, "dram_write": None},
        "flops": {"tensor": count.tensor_flops, "exp": count.exp_ops,
                  "other": count.other_flops},
        "sram_bytes_per_cta": res.smem_per_cta_bytes,
        "ctas_per_sm": res.ctas_per_sm,
        "residency_limited_by": res.limited_by,
        "registers_per_thread": res.registers_per_thread,
        "spill_bytes_per_iteration": given and given.spill_bytes_per_iteration,
        "spill_reload_waits": given and given.spill_reload_waits,
        "loop_instructions": given and given.loop_instructions,
        "straight_instructions": given and given.straight_instructions,
        "prologue_instructions": given and given.prologue_instructions,
        "epilogue_instructions": given and given.epilogue_instructions,
        "masked_loop_instructions": given and given.masked_loop_instructions,
        "resources": resources,
        "warp_layout": layout,
        "legal": res.ctas_per_sm > 0,
    }


def local_bytes(kernel, res, tiling: Tiling, hw: Hardware, given) -> tuple[int, int]:
    """The bytes ``kernel``'s spills read from L2 and write to it over all its loop
    iterations (``simulator.spills``): the reloads that miss L1 and every store; (0, 0)
    where its compile does not say what it spills."""
    from simulator.spills import spill_traffic

    if given is None:
        return 0, 0
    traffic = spill_traffic(given, res, tiling.threads, hw)
    iterations = int(kernel.loop_count.sum())
    return round(traffic.reload_bytes * iterations), round(traffic.store_bytes * iterations)


def l2_bytes(moved: dict) -> int:
    """The bytes that cross L2, from a prediction's (or a kernel's) ``bytes``: the tiles'
    (global) and the spills' that miss L1 (local, ``local_bytes``)."""
    return (moved["global_read"] + moved["global_write"] + moved.get("local_read", 0)
            + moved.get("local_write", 0))


def resources_source(compiled, name: str) -> str:
    """Where a kernel's registers and shared memory came from: ``"compiled"`` (both,
    compiled here or a record's), ``"table"`` (both, from tilesim's table of compiles,
    ``kernels.table``), ``"compiled shared memory"`` or ``"compiled registers"`` (one; the
    other estimated), or ``"estimated"``."""
    given = (compiled or {}).get(name)
    registers = bool(given and given.registers_per_thread is not None)
    shared = bool(given and given.shared_bytes is not None)
    if registers and shared:
        return given.source
    if registers or shared:
        return "compiled registers" if registers else "compiled shared memory"
    return "estimated"


def count_prediction(problem: AttentionProblem, tiling: Tiling, schedule: str,
                     hw: Hardware, compiled=None) -> dict:
    """Exact counts (closed form) for every kernel of the schedule; timing fields ``None``.
    ``compiled``: the compiler's registers and shared memory by kernel name, where given
    (``simulator.occupancy.CompiledResources``), for residency."""
    check_supported(problem, tiling, schedule)
    return assemble_prediction(problem, tiling, schedule, hw,
                               closed_form(problem, tiling, schedule), compiled)


def assemble_prediction(problem: AttentionProblem, tiling: Tiling, schedule: str,
                        hw: Hardware, counts: list[KernelCount], compiled=None) -> dict:
    """The prediction dict from per-kernel counts (closed form or replayed from a trace).

    SRAM per CTA and residency come from the schedule's kernels and the hardware.
    """
    sched = build_schedule(problem, tiling, schedule)
    if [c.name for c in counts] != [k.name for k in sched.kernels]:
        raise ValueError("counts do not match the schedule's kernels")
    kernels, per_tensor = [], {}
    for kernel, count in zip(sched.kernels, counts, strict=True):
        res = kernel_residency(kernel, tiling, problem.head_dim, hw, compiled)
        layout = warp_layout(kernel, tiling.num_warps, problem.elem_bytes, hw)
        given = (compiled or {}).get(kernel.name)
        kernels.append(_kernel_entry(count, res, resources_source(compiled, kernel.name),
                                     layout, given, local_bytes(kernel, res, tiling, hw, given)))
        for tensor in sched.tensors:
            entry = per_tensor.setdefault(tensor, {"global_read": 0, "global_write": 0,
                                                   "dram_read": None, "dram_write": None})
            entry["global_read"] += count.reads.get(tensor, 0)
            entry["global_write"] += count.writes.get(tensor, 0)
    global_read = sum(k["bytes"]["global_read"] for k in kernels)
    global_write = sum(k["bytes"]["global_write"] for k in kernels)
    local_read = sum(k["bytes"]["local_read"] for k in kernels)
    local_write = sum(k["bytes"]["local_write"] for k in kernels)
    tensor_flops = sum(k["flops"]["tensor"] for k in kernels)
    main = max(kernels, key=lambda k: (k["flops"]["tensor"], k["bytes"]["global_read"]))
    fits_memory = device_memory.fits(sched.device_bytes, hw)
    return {
        "schema": SCHEMA,
        "tool_version": tool_version(),
        "problem": problem.to_dict(),
        "tiling": tiling.to_dict(),
        "schedule": schedule,
        "hardware": hw.name,
        "bytes": {"global_read": global_read, "global_write": global_write,
                  "local_read": local_read, "local_write": local_write,
                  "dram_read": None, "dram_write": None,
                  "smem_read": global_read, "smem_write": global_read},
        "per_tensor": per_tensor,
        "flops": {"tensor": tensor_flops,
                  "exp": sum(k["flops"]["exp"] for k in kernels),
                  "other": sum(k["flops"]["other"] for k in kernels),
                  "convention": problem.convention_flops()},
        "arithmetic_intensity": tensor_flops / max(global_read + global_write, 1),
        "sram_peak_bytes_per_cta": max(k["sram_bytes_per_cta"] for k in kernels),
        "ctas_per_sm": main["ctas_per_sm"],
        "device_memory_bytes": sched.device_bytes,
        "fits_device_memory": fits_memory,
        "legal": all(k["legal"] for k in kernels) and fits_memory,
        "time_s": None,
        "bound": None,
        "kernels": kernels,
    }
