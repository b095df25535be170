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

from simulator.cli.resources_args import resources_from_args, resources_source
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
