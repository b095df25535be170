"""Where a prediction command takes its kernels' registers, shared memory, spills and
instruction counts: tilesim's table of compiles (by default, where it has the schedule's
kernels), a compile here (``--compiled-resources``) or the estimate
(``--estimated-resources``)."""

from __future__ import annotations

import argparse

from traces.problem import ProblemError


def add_compiled_arg(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--compiled-resources", action="store_true",
        help="compile this schedule's Triton kernels ahead of time for the preset's GPU "
             "(sm_90 or sm_80; needs the kernels extra: torch and triton; seconds per kernel) "
             "and take their registers, shared memory, spills and instruction counts, not "
             "the estimate. Without it, those of tilesim's table of compiles (kernels/"
             "table.py: FA2's, FA1's, naive attention's and decode's kernels on sm_90 "
             "and sm_80) where it has the schedule's kernels")
    source.add_argument(
        "--estimated-resources", action="store_true",
        help="estimate registers and shared memory from the tiles, even where tilesim's "
             "table of compiles has the kernels")


def compiled_from_args(args: argparse.Namespace, problem, tiling, schedule: str, hw):
    """Kernel name -> ``CompiledResources``: compiled here with ``--compiled-resources``,
    else from tilesim's table of compiles where it covers the schedule (``table_resources``)
    unless ``--estimated-resources``; None: estimate. ``ProblemError`` (one line) when the
    kernels cannot be compiled for this."""
    (compiled,) = resources_from_args(args, problem, [tiling], schedule, hw)
    if isinstance(compiled, str):
        raise ProblemError(f"{resources_source(args)}: {compiled}")
    return compiled


def resources_source(args: argparse.Namespace) -> str:
    """Where ``args`` take compiled resources from, as a message names it."""
    return ("--compiled-resources" if getattr(args, "compiled_resources", False)
            else "the table of compiles")


def resources_from_args(args: argparse.Namespace, problem, tilings: list, schedule: str, hw,
                        progress=None) -> list:
    """``compiled_from_args`` for several tilings: one entry per tiling (kernel name ->
    ``CompiledResources``, or why a kernel does not compile), or None for each where the
    resources are estimated."""
    if getattr(args, "compiled_resources", False):
        return compile_resources(problem, tilings, schedule, hw, progress=progress)
    if not getattr(args, "estimated_resources", False):
        shipped = table_resources(problem, tilings, schedule, hw)
        if shipped is not None:
            return shipped
    return [None] * len(tilings)


def table_note(hw) -> str:
    """Where a prediction's table-sourced resources for ``hw`` come from, in one line."""
    from kernels import table

    arch = hw.compute_capability
    return (f"registers, shared memory, spills and instruction counts from tilesim's table "
            f"of Triton {table.header(arch).get('triton', '?')} compiles for sm_{arch} "
            f"(kernels/table.py; --estimated-resources to estimate them)")


def table_compiled(problem, tiling, schedule: str, hw) -> dict | None:
    """``table_resources`` of one tiling: kernel name -> ``CompiledResources``, None where
    the table has none of the schedule's kernels; ``ProblemError`` (one line) where it says
    a kernel does not compile."""
    shipped = table_resources(problem, [tiling], schedule, hw)
    if shipped is None:
        return None
    if isinstance(shipped[0], str):
        raise ProblemError(f"the table of compiles: {shipped[0]}")
    return shipped[0]


def table_compiled_pair(problem, tiling, hw) -> dict:
    """``table_compiled`` of naive attention and FA2 (``explain.model.PAIR``), as
    ``explain.model.predict_pair`` takes them."""
    from simulator.explain.model import PAIR

    return {name: table_compiled(problem, tiling, name, hw) for name in PAIR}


def table_resources(problem, tilings: list, schedule: str, hw) -> list | None:
    """For each tiling, kernel name -> ``CompiledResources`` from tilesim's table of
    compiles (``kernels.table``) of the schedule's kernels it has for every tiling (so that
    a sweep rates all its tilings alike; the others are estimated), or why a kernel does
    not compile; None where it has none of them. Needs neither Triton nor a compile."""
    from kernels import resources, table

    arch = hw.compute_capability
    if not table.current(arch):  # no table for this architecture, or a stale one
        return None
    names = _kernel_names(problem, tilings, schedule, hw)
    if names is None:
        return None
    per_tiling = [table.problem_rows(problem, tiling, names, arch) for tiling in tilings]
    found = {name: [rows.get(name) for rows in per_tiling]
             for name in names if name in resources.KERNELS}
    covered = [name for name, rows in found.items() if all(rows)]
    if not covered:
        return None
    out = []
    for i, tiling in enumerate(tilings):
        rows = {name: resources.KernelResources.of_job(found[name][i], tiling,
                                                       problem.head_dim)
                for name in covered}
        out.append(_compiled_of(rows, hw, source="table"))
    return out


def _kernel_names(problem, tilings: list, schedule: str, hw) -> list[str] | None:
    """The schedule's kernels, from the first tiling whose tensors fit in ``hw``'s device
    memory; None if none does (its grids may be too large to build: naive attention at N =
    64k and 16x16 tiles has 2^29 CTAs; the memory check refuses them next, in one line)."""
    from simulator.device_memory import DeviceMemoryError, check_device_memory
    from traces.schedules import build_schedule

    for tiling in tilings:
        try:
            check_device_memory(problem, tiling, schedule, hw)
        except DeviceMemoryError:
            continue
        return [k.name for k in build_schedule(problem, tiling, schedule).kernels]
    return None


def compile_resources(problem, tilings: list, schedule: str, hw, progress=None) -> list:
    """For each tiling, kernel name -> ``CompiledResources`` of the schedule's Triton twins
    compiled ahead of time for ``hw``, or a string saying which kernel does not compile.
    ``ProblemError`` (one line) when none can be compiled here at all."""
    from kernels import resources  # imports neither torch nor triton
    from kernels.compile_order import measured_evenly

    resources.require_compiler("--compiled-resources")

    if hw.compute_capability not in resources.MAX_SHARED_BYTES:
        raise ProblemError(f"--compiled-resources compiles for sm_80 or sm_90; {hw.name} has "
                           f"compute capability {hw.compute_capability}")
    names = _kernel_names(problem, tilings, schedule, hw)
    if names is None:
        return [None] * len(tilings)
    try:
        per_tiling = measured_evenly(
            lambda in_order: resources.schedule_resources(
                problem, in_order, names, hw.compute_capability, progress=progress), tilings)
    except ImportError as exc:  # installed, but broken
        raise ProblemError(f"--compiled-resources: cannot import {exc.name or 'triton'}: "
                           f"{exc}") from None
    except (ValueError, RuntimeError) as exc:
        raise ProblemError(f"--compiled-resources: {exc}") from None
    return [_compiled_of(rows, hw) for rows in per_tiling]


def _compiled_of(rows: dict, hw, source: str = "compiled"):
    """Kernel name -> ``CompiledResources`` of one tiling's compiles (``kernels.resources.
    KernelResources`` by name), or a string saying which kernel does not compile.
    ``ProblemError`` (one line) for a kernel with more registers than ``hw`` allows."""
    from simulator.occupancy import CompiledResources, spill_fields

    over = [r for r in rows.values() if (r.registers or 0) > hw.max_registers_per_thread]
    if over:
        where = "--compiled-resources" if source == "compiled" else "the table of compiles"
        raise ProblemError(f"{where}: {over[0].kernel} compiles to "
                           f"{over[0].registers} registers per thread, above {hw.name}'s "
                           f"max_registers_per_thread {hw.max_registers_per_thread}")
    failed = [r for r in rows.values() if r.error]
    if failed:
        return f"{failed[0].kernel} does not compile for this tiling: {failed[0].error}"
    return {name: CompiledResources(r.registers, r.shared_bytes,
                                    spill_reload_waits=r.spill_reload_waits,
                                    loop_instructions=r.loop_instructions,
                                    straight_instructions=r.straight_instructions,
                                    prologue_instructions=r.prologue_instructions,
                                    epilogue_instructions=r.epilogue_instructions,
                                    masked_loop_instructions=r.masked_loop_instructions,
                                    source=source,
                                    **spill_fields(r.spill_load_bytes_per_iteration,
                                                   r.spill_store_bytes_per_iteration,
                                                   r.spill_bytes))
            for name, r in rows.items()}
