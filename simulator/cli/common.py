"""Arguments shared by the subcommands: problem, tiling, hardware, output files."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from traces.problem import DTYPE_BYTES, PASSES, AttentionProblem, ProblemError
from traces.tiling import Tiling

SCHEDULES = ("naive", "fa1", "fa2", "decode")


def add_hardware_arg(parser: argparse.ArgumentParser, default: str = "h100-sxm5") -> None:
    parser.add_argument(
        "--hardware", default=default,
        help=f"preset name or path to a .toml file (default {default}; "
        "see `tilesim hardware list`)",
    )
    add_set_arg(parser)


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="hardware_set", action="append", default=[], metavar="FIELD=VALUE",
        help="what if: replace one number of the hardware, e.g. --set "
        "hbm_bandwidth_bytes_per_s=8e12 or --set tensor_flops_per_s.bf16=2e15 (repeatable; "
        "fields as `tilesim hardware show --json` names them). Compute rates are the "
        "chip's, divided over its SMs: --set sm_count alone spreads the same rates over "
        "more SMs; to add SMs, scale tensor_flops_per_s, exp_ops_per_s and "
        "fp32_flops_per_s with it",
    )


def hardware_from_args(args: argparse.Namespace, name: str | None = None):
    """The hardware the command runs on: ``--hardware`` (or ``name``) with ``--set``."""
    from simulator.hardware import load_hardware, with_overrides

    hw = load_hardware(name if name is not None else args.hardware)
    return with_overrides(hw, getattr(args, "hardware_set", []))


def add_compiled_arg(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--compiled-resources", action="store_true",
        help="compile this schedule's Triton kernels ahead of time for the preset's GPU "
             "(sm_90 or sm_80; needs the kernels extra: torch and triton; seconds per kernel) "
             "and take their registers, shared memory, spills and instruction counts, not "
             "the estimate. Without it, those of tilesim's table of compiles (kernels/"
             "table.py: FA2's, FA1's and naive attention's kernels on sm_90 and sm_80, "
             "decode's on sm_90) "
             "where it has the schedule's kernels")
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

    resources.require_compiler("--compiled-resources")

    if hw.compute_capability not in resources.MAX_SHARED_BYTES:
        raise ProblemError(f"--compiled-resources compiles for sm_80 or sm_90; {hw.name} has "
                           f"compute capability {hw.compute_capability}")
    names = _kernel_names(problem, tilings, schedule, hw)
    if names is None:
        return [None] * len(tilings)
    try:
        per_tiling = resources.schedule_resources(problem, tilings, names,
                                                  hw.compute_capability, progress=progress)
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


def add_problem_args(parser: argparse.ArgumentParser, schedule: bool = True) -> None:
    g = parser.add_argument_group("problem")
    if schedule:
        g.add_argument("--schedule", choices=SCHEDULES, default="fa2")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--heads", type=int, default=32)
    g.add_argument("--kv-heads", type=int, default=None,
                   help="K/V heads (GQA/MQA); default = heads")
    g.add_argument("--seq", type=int, default=4096, help="query sequence length")
    g.add_argument("--kv-seq", type=int, default=None, help="key/value length; default = --seq")
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16")
    g.add_argument("--causal", action="store_true")
    g.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd")


def add_tiling_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    g = parser.add_argument_group("tiling")
    g.add_argument("--block-m", type=int, default=None if not required else 128)
    g.add_argument("--block-n", type=int, default=None if not required else 64)
    g.add_argument("--stages", type=int, default=None)
    g.add_argument("--warps", type=int, default=None)
    g.add_argument("--split-kv", type=int, default=None)


def problem_from_args(args: argparse.Namespace) -> AttentionProblem:
    return AttentionProblem(
        batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seq_q=args.seq,
        seq_kv=args.kv_seq, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
        pass_=args.pass_,
    )


def tiling_from_args(args: argparse.Namespace) -> Tiling:
    """The tiling the user gave; unset fields take the defaults of ``Tiling``."""
    given = {
        "block_m": args.block_m, "block_n": args.block_n, "num_stages": args.stages,
        "num_warps": args.warps, "split_kv": args.split_kv,
    }
    return Tiling(**{k: v for k, v in given.items() if v is not None})


# When the user sets no tile flag and a CTA of the default tiling cannot be resident on the
# GPU (head_dim 256 on an A100, fp32 on an RTX 4090), these blocks are tried in turn, at the
# default's stages and then at one stage: the first that every kernel fits is used.
FALLBACK_BLOCKS = ((64, 64), (64, 32), (32, 32), (32, 16), (16, 16))
TILE_FLAGS = ("block_m", "block_n", "stages", "warps")


def tiling_that_fits(args: argparse.Namespace, problem: AttentionProblem,
                     schedules: tuple[str, ...], hw) -> tuple[Tiling, str | None]:
    """The tiling a command runs: the user's (``tiling_from_args``), or, where they set
    none of ``TILE_FLAGS`` and some kernel of ``schedules`` cannot fit the default on
    ``hw``, the first of ``FALLBACK_BLOCKS`` (at the default's stages, then one) that every
    kernel fits, with a note saying so (None otherwise). Residency as ``simulator.sim``
    checks it (``misfit``), with the resources the command then takes
    (``resources_from_args``: tilesim's table of compiles where it has the kernels, a
    compile here with ``--compiled-resources``, else the tiles' estimate), so that the
    default falls back exactly where the user's same tiling would be refused; a tiling
    whose kernels do not compile counts as not fitting. A problem the schedules refuse for
    any other reason is refused here, as the command would. If none fits, the default
    stays and the command refuses it as before."""
    from dataclasses import replace

    tiling = tiling_from_args(args)
    if any(getattr(args, flag, None) is not None for flag in TILE_FLAGS):
        return tiling, None
    why = _misfit(args, problem, tiling, schedules, hw)
    if why is None:
        return tiling, None
    for stages in dict.fromkeys((tiling.num_stages, 1)):
        for block_m, block_n in FALLBACK_BLOCKS:
            smaller = replace(tiling, block_m=block_m, block_n=block_n, num_stages=stages)
            if _misfit(args, problem, smaller, schedules, hw) is None:
                return smaller, (f"note: {why}; using BM={block_m} BN={block_n} stages={stages} "
                                 f"warps={smaller.num_warps}, the first smaller tiling that "
                                 f"fits (--block-m, --block-n, --stages, --warps to choose; "
                                 f"tilesim sweep ranks every tiling that fits)")
    return tiling, None


def _misfit(args: argparse.Namespace, problem: AttentionProblem, tiling: Tiling,
            schedules: tuple[str, ...], hw) -> str | None:
    """Why a CTA of some kernel of ``schedules`` cannot be resident on ``hw`` with the
    resources ``args`` select (``misfit``'s reason), or why it does not compile; None where
    every kernel fits. ``ProblemError`` where a schedule refuses the problem itself. A
    schedule whose tensors outgrow device memory is not built (its grids can be huge) and
    counts as fitting: the command refuses it, or counts it, as such."""
    from simulator.device_memory import DeviceMemoryError, check_device_memory
    from simulator.sim import misfit
    from traces.schedules import build_schedule

    for name in schedules:
        try:
            check_device_memory(problem, tiling, name, hw)
        except DeviceMemoryError:
            continue
        schedule = build_schedule(problem, tiling, name)
        (compiled,) = resources_from_args(args, problem, [tiling], name, hw)
        if isinstance(compiled, str):
            return f"{resources_source(args)}: {compiled}"
        found = misfit(schedule, hw, compiled)
        if found is not None:
            return found[0]
    return None


def check_counts(*flags: tuple[str, int | None]) -> None:
    """``ProblemError`` (one line) for the first ``(flag, value)`` below 1 (None: not given)."""
    for flag, value in flags:
        if value is not None and value < 1:
            raise ProblemError(f'"{flag}" must be >= 1, got {value}.')


def cores() -> int:
    """The CPU cores this process may use: the default worker count of the commands that
    spread simulations over processes (``sweep``, ``reconcile``, ``calibrate``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def check_output_paths(*paths: str | Path | None) -> None:
    """``ProblemError`` (one line) unless each given path's directory exists and is writable.

    Commands call it before a long computation, so that a mistyped output path fails at
    once instead of after the work.
    """
    for path in paths:
        if path is None:
            continue
        if not str(path):
            raise ProblemError("an output path is empty: give the name of the file to write")
        if str(path).endswith(("/", os.sep)):
            raise ProblemError(f"cannot write {path}: it names a directory; give the name of "
                               "the file to write")
        path = Path(path)
        if path.is_dir():
            raise ProblemError(f"cannot write {path}: it is a directory; give the name of "
                               "the file to write")
        if _special(path):  # /dev/null, a FIFO: written into, its folder need not be
            if not os.access(path, os.W_OK):
                raise ProblemError(f"cannot write {path}: not writable")
            continue
        directory = path.parent if str(path.parent) else Path(".")
        if not directory.is_dir():
            raise ProblemError(f"cannot write {path}: directory {directory} does not exist")
        if not os.access(directory, os.W_OK):
            raise ProblemError(f"cannot write {path}: directory {directory} is not writable")


def new_file_mode() -> int:
    """The permissions ``open()`` would give a new file: 0o666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, flush it to disk, then rename onto ``path``: no partial
    file is ever left, and a crash after the rename keeps the new file whole.

    A symbolic link is followed (its target is replaced, the link stays). A path that is
    not a regular file (``/dev/null``, a FIFO) is written into, not replaced: a rename
    would put a plain file in place of the device.
    Raises ``ProblemError`` with one clear line if the directory is not writable.
    """
    check_output_paths(path)
    if _special(Path(path)):
        _write_through(Path(path), write)
        return
    path = Path(os.path.realpath(path))
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ProblemError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        os.chmod(tmp_path, new_file_mode())  # mkstemp makes it private to its owner
        write(tmp_path)
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
    except OSError as exc:
        raise ProblemError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


STREAM_PATHS = ("/dev/std", "/dev/fd/", "/proc/")  # a process's own streams


def _special(path: Path) -> bool:
    """An existing path that is no regular file (a device, a FIFO), or one of the process's
    streams (``/dev/stdout`` redirected to a file: renaming a file over it would lose what
    is printed after). Such paths are written into, appended to."""
    if not path.exists() or path.is_dir():
        return False
    return not path.is_file() or str(path).startswith(STREAM_PATHS)


def _write_through(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a temporary file, then copy its bytes into ``path`` (a device or FIFO,
    which must stay what it is)."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="tilesim-") as folder:
        tmp_path = Path(folder) / path.name
        try:
            write(tmp_path)
            with open(tmp_path, "rb") as src, open(path, "ab") as dst:
                shutil.copyfileobj(src, dst)
        except OSError as exc:
            raise ProblemError(f"cannot write {path}: {exc.strerror or exc}") from None


SKIPPED_LINES_SHOWN = 3  # warnings printed for malformed record lines; the rest counted


def read_records_or_fail(paths: list[str]) -> tuple[list[dict], list]:
    """The valid records of ``paths`` and the malformed lines. The first few malformed lines
    are warned about on stderr (then how many more); ``ProblemError`` (one line) if no line
    is a valid record."""
    from validation.records import read_many

    records, errors = read_many(paths)
    if not records:
        skipped = (f" ({len(errors)} malformed line{'s' if len(errors) > 1 else ''}, the "
                   f"first: {errors[0]})" if errors else " (no lines)")
        raise ProblemError("no valid records in " + ", ".join(paths) + skipped)
    for err in errors[:SKIPPED_LINES_SHOWN]:
        sys.stderr.write(f"tilesim: warning: skipped {err}\n")
    if len(errors) > SKIPPED_LINES_SHOWN:
        sys.stderr.write(f"tilesim: warning: skipped {len(errors) - SKIPPED_LINES_SHOWN} "
                         "more malformed lines\n")
    return records, errors


def add_loop_facts_args(parser: argparse.ArgumentParser) -> None:
    """``--fill-loop-facts`` and ``--as-recorded``: where records that lack their kernels'
    main-loop facts take them (``validation.fill_facts``); by default from tilesim's table
    of compiles alone, as the prediction commands take them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fill-loop-facts", action="store_true",
                       help="records without the main-loop facts of their kernels (a "
                            "warp's instructions per iteration, or in all in a kernel "
                            "without loops; spills per iteration and the waits for them; "
                            "the H200 records of 2026-11-30) take them, as by default, "
                            "from tilesim's table of compiles where it has all their "
                            "kernels and the device ran its Triton, and the others from a "
                            "compile here (needs torch and triton; cached); for each "
                            "kernel the compile gives the device's registers")
    group.add_argument("--as-recorded", action="store_true",
                       help="predict each record with the kernel facts it carries alone, "
                            "without those tilesim's table of compiles has for it (by "
                            "default a record without loop facts takes the table's, as "
                            "simulate takes them for its config)")


def fill_loop_facts_as_asked(records: list[dict], args: argparse.Namespace,
                             command: str) -> tuple[list[dict], dict | None]:
    """The records with the loop facts ``add_loop_facts_args``' flags ask for, and
    ``validation.fill_facts.fill_saying_how``'s account of them (None with
    ``--as-recorded``, and by default where the table gave no record any)."""
    if args.as_recorded:
        return records, None
    from validation.fill_facts import fill_saying_how

    out, filled = fill_saying_how(records, progress_lines(command, "problems compiled"),
                                  compile_here=args.fill_loop_facts)
    return out, filled if args.fill_loop_facts or filled["records"] else None


def output_console(width: int = 140):
    """A rich console on stdout. Off a terminal (piped, captured) rich would squeeze tables
    into 80 columns and cut their cells short; there it is at least ``width`` wide."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, width))
    return console


def print_json(obj: dict) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def progress_lines(command: str, what: str, steps: int = 10, quiet_s: float = 10.0,
                   clock: Callable[[], float] = time.perf_counter):
    """A ``progress(done, total)`` callback that says on stderr, at each tenth of the way
    (``steps``), how far ``command`` is: ``tilesim: reconcile: 31 of 305 records predicted
    (41 s)``. Silent for the first ``quiet_s`` seconds, so that a quick run (or one that
    ends in an error: one line) prints nothing of it; stdout stays the command's own."""
    start = clock()
    said = [0]

    def progress(done: int, total: int) -> None:
        step = done * steps // total
        elapsed = clock() - start
        if step > said[0] and elapsed >= quiet_s:
            said[0] = step
            print(f"tilesim: {command}: {done} of {total} {what} ({elapsed:.0f} s)",
                  file=sys.stderr, flush=True)

    return progress
