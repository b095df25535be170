"""``tilesim sweep``: simulate every legal tiling of a problem and rank them by time.

Tilings: ``block_m`` and ``block_n`` over the powers of two 16..256, ``num_stages`` 1..5,
``num_warps`` 4 and 8; each flag narrows its axis (``--block-m 64,128 --stages 2,3``). The
decode schedule does not use ``block_m``: its sweep varies ``split_kv`` (powers of two up
to the number of K/V blocks) instead. Tilings whose CTA does not fit on an SM are left
out (counted). Simulations run in parallel over the CPU's cores with a progress bar; all
tilings of one sweep use the same engine (aggregated as soon as one needs it), so their
times compare like with like. Prints the ranked table (best marked; how many tilings lie
within ``TIE`` of the best, since a tie leaves the choice free), ``--plot`` writes a
heatmap of the best time per (block_m, block_n) cell, ``--json`` prints every result.
``--compiled-resources`` first compiles every candidate's kernels ahead of time (minutes
for a full sweep) and rates each tiling with its real registers and shared memory.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

from simulator.cli.common import (
    add_hardware_arg,
    add_problem_args,
    check_counts,
    cores,
    hardware_from_args,
    print_json,
    problem_from_args,
)
from simulator.cli.resources_args import add_compiled_arg, resources_from_args, table_note
from simulator.explain.common import check_plot_path
from traces.problem import ProblemError

BLOCKS = (16, 32, 64, 128, 256)
STAGES = (1, 2, 3, 4, 5)
WARPS = (4, 8)
MEMORY_REASON = "need more device memory than the GPU has"
COMPILE_REASON = "do not compile (--compiled-resources)"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))  # int() allows spaces, not ""
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="simulate all legal tilings in parallel, ranked by time",
                       description=__doc__.split("\n\n")[0])
    add_hardware_arg(p)
    add_problem_args(p)
    g = p.add_argument_group("tilings (comma-separated values; default: all)")
    g.add_argument("--block-m", type=_int_list, default=BLOCKS)
    g.add_argument("--block-n", type=_int_list, default=BLOCKS)
    g.add_argument("--stages", type=_int_list, default=STAGES)
    g.add_argument("--warps", type=_int_list, default=WARPS)
    g.add_argument("--split-kv", type=_int_list, default=None,
                   help="decode only (default: powers of two up to the K/V block count)")
    p.add_argument("--json", action="store_true", help="print every result as JSON")
    p.add_argument("--plot", metavar="PATH",
                   help="heatmap of the best time per block shape (.png or .svg)")
    p.add_argument("--top", type=int, default=20, help="rows of the ranked table (default 20)")
    add_compiled_arg(p)
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes (default and at most: the cores)")
    p.add_argument("--mode", choices=("auto", "full", "aggregated"), default="auto")
    p.set_defaults(func=run)


def candidate_tilings(args, problem) -> list:
    """Every tiling the flags allow (not yet checked against the hardware)."""
    from traces.schedules.base import cdiv
    from traces.tiling import Tiling

    if args.schedule == "decode":
        if args.split_kv is None:
            largest = max(cdiv(problem.seq_kv, bn) for bn in args.block_n)
            splits = tuple(2 ** i for i in range(int(math.log2(largest)) + 1))
        else:
            splits = args.split_kv
        axes = itertools.product((128,), args.block_n, args.stages, args.warps, splits)
    else:
        if args.split_kv not in (None, (1,)):
            raise ProblemError(f'"split_kv" applies to the decode schedule only, '
                               f'not "{args.schedule}"')
        axes = itertools.product(args.block_m, args.block_n, args.stages, args.warps, (1,))
    return [Tiling(bm, bn, st, w, sp) for bm, bn, st, w, sp in axes]


def legal_tilings(problem, schedule: str, hw, tilings, compiled=None) -> tuple[list, dict]:
    """The tilings that run, and why the others do not (reason -> count). If none runs
    for one reason that is not the tiling's (the tensors outgrow device memory, the schedule
    has no such pass), raises that error alone. ``compiled[i]``: tiling ``i``'s compiled
    resources (kernel name -> ``CompiledResources``), or why it does not compile."""
    from simulator.device_memory import DeviceMemoryError, check_device_memory
    from simulator.sim import check_fits
    from traces.schedules import build_schedule

    legal, refused, too_large, problem_errors = [], {}, None, set()
    for i, tiling in enumerate(tilings):
        resources = compiled[i] if compiled else None
        if isinstance(resources, str):
            refused[COMPILE_REASON] = refused.get(COMPILE_REASON, 0) + 1
            continue
        try:
            check_device_memory(problem, tiling, schedule, hw)
            check_fits(build_schedule(problem, tiling, schedule), hw, resources)
        except DeviceMemoryError as exc:
            too_large = exc
            refused[MEMORY_REASON] = refused.get(MEMORY_REASON, 0) + 1
            continue
        except ProblemError as exc:
            reason = _reason(str(exc))
            refused[reason] = refused.get(reason, 0) + 1
            if reason == str(exc):  # not a kind of tiling's refusal: the problem's own
                problem_errors.add(reason)
            continue
        legal.append(tiling)
    if not legal and list(refused) == [MEMORY_REASON]:
        raise too_large
    if not legal and len(refused) == 1 and next(iter(refused)) in problem_errors:
        raise ProblemError(next(iter(refused)))  # the same message for every tiling
    return legal, refused


def _reason(message: str) -> str:
    """One line per kind of refusal, not per tiling."""
    for needle, reason in (("does not fit", "do not fit on the GPU"),
                           ("exceeds", "have split_kv above the K/V block count"),
                           ("empty chunks", "have split_kv leaving empty chunks")):
        if needle in message:
            return reason
    return message


def sweep_mode(problem, schedule: str, tilings, requested: str) -> str:
    """One engine for the whole sweep: aggregated if any tiling is too large for full."""
    from simulator.sim import FULL_MODE_MAX_STEPS
    from traces.schedules import build_schedule

    if requested != "auto":
        return requested
    for tiling in tilings:
        kernels = build_schedule(problem, tiling, schedule).kernels
        if sum(int(k.loop_count.sum()) + k.grid for k in kernels) > FULL_MODE_MAX_STEPS:
            return "aggregated"
    return "full"


def _simulate_one(job: tuple) -> dict:
    problem, tiling, schedule, hw, mode, compiled = job
    from simulator.sim import predict

    try:
        pred, _ = predict(problem, tiling, schedule, hw, mode, compiled)
    except ProblemError as exc:
        return {"tiling": tiling.to_dict(), "error": str(exc)}
    return pred


def run_sweep(problem, schedule: str, hw, tilings, mode: str, jobs: int,
              progress: bool = True, compiled=None) -> list[dict]:
    """Simulate ``tilings`` (in parallel when ``jobs > 1``; ``compiled[i]``: tiling
    ``i``'s compiled resources, if given); results ranked by time."""
    from simulator.sim import run
    from simulator.sim.warmup import fast_numba_start

    work = [(problem, t, schedule, hw, mode, compiled[i] if compiled else None)
            for i, t in enumerate(tilings)]
    results = []
    bar = None
    if jobs > 1 and len(work) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # Start numba and load the compiled code once, here: forked workers inherit it.
        fast_numba_start()
        small = type(problem)(batch=1, heads=1, seq_q=256, head_dim=problem.head_dim,
                              dtype=problem.dtype)
        run(small, tilings[0].__class__(), "fa2", hw, "full")
        run(small, tilings[0].__class__(), "fa2", hw, "aggregated")
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(_simulate_one, item) for item in work]
            # The workers are forked by now: the progress bar's refresh thread starts after
            # (forking a process that runs threads can leave their locks held in the child).
            bar = _progress(len(work)) if progress else None
            for future in as_completed(futures):
                results.append(future.result())
                if bar:
                    bar[0].advance(bar[1])
    else:
        bar = _progress(len(work)) if progress else None
        for item in work:
            results.append(_simulate_one(item))
            if bar:
                bar[0].advance(bar[1])
    if bar:
        bar[0].stop()
    return sorted(results, key=_rank_key)


def _compile_progress():
    """A ``progress(done, total)`` for the compiles, on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        return None
    state = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = _progress(total, "compiling kernels")
        bar, task = state["bar"]
        bar.update(task, completed=done)
        if done == total:
            bar.stop()

    return progress


def _rank_key(result: dict):
    t = result["tiling"]
    time_s = result.get("time_s")
    return (time_s is None, time_s or 0.0, t["block_m"], t["block_n"], t["num_stages"],
            t["num_warps"], t["split_kv"])


def _progress(total: int, what: str = "simulating tilings"):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task(what, total=total)
    bar.start()
    return bar, task


def run(args) -> int:
    check_counts(("--jobs", args.jobs), ("--top", args.top))
    hw = hardware_from_args(args)
    check_plot_path(args.plot)
    problem = problem_from_args(args)
    tilings = candidate_tilings(args, problem)
    compiled = resources_from_args(args, problem, tilings, args.schedule, hw,
                                   progress=_compile_progress())
    legal, refused = legal_tilings(problem, args.schedule, hw, tilings, compiled)
    if compiled:
        of_tiling = dict(zip(tilings, compiled, strict=True))
        compiled = [of_tiling[t] for t in legal]
    if not legal:
        reasons = "; ".join(f"{n} {r}" for r, n in refused.items())
        raise ProblemError(f"no legal tiling among the {len(tilings)} candidates ({reasons})")
    mode = sweep_mode(problem, args.schedule, legal, args.mode)
    # Each simulation keeps one core busy: workers beyond the cores or the tilings only
    # cost their start.
    available = cores()
    jobs = min(args.jobs or available, available, len(legal))
    results = run_sweep(problem, args.schedule, hw, legal, mode, jobs,
                        progress=sys.stderr.isatty() or not args.json, compiled=compiled)
    if args.plot:
        write_heatmap(results, args.plot, decode=args.schedule == "decode")
    if args.json:
        print_json({"schema": "tilesim.sweep/1", "schedule": args.schedule,
                    "hardware": hw.name, "problem": problem.to_dict(), "mode": mode,
                    "candidates": len(tilings), "refused": refused, "results": results})
        return 0
    _print_ranked(results, args, hw, problem, mode, len(tilings), refused)
    return 0


def _print_ranked(results, args, hw, problem, mode, candidates, refused) -> None:
    from rich.table import Table

    from simulator.cli.render import fmt_bytes, fmt_time, print_tables
    from simulator.explain.model import OPERAND_CAVEAT, TIE, ties_differ_in_block_n
    from simulator.prediction import tile_copies

    decode = args.schedule == "decode"
    table = Table(title=f"{args.schedule} on {hw.name}: {problem.describe()} — "
                        f"{len(results)} legal tilings of {candidates}, {mode} simulation",
                  title_justify="left")
    for col in ("#", "split" if decode else "BM", "BN", "stages", "warps", "time", "TFLOP/s",
                "DRAM bytes", "SRAM/CTA", "CTAs/SM", "bound", ""):
        table.add_column(col, justify="left" if col in ("bound", "") else "right")
    for rank, r in enumerate(results[: args.top], start=1):
        t = r["tiling"]
        first = t["split_kv"] if decode else t["block_m"]
        if "error" in r:
            table.add_row(str(rank), str(first), str(t["block_n"]), str(t["num_stages"]),
                          str(t["num_warps"]), "-", "-", "-", "-", "-", "-", r["error"])
            continue
        copies = tile_copies(r)
        marks = (["[bold green]best[/]"] if rank == 1 else []) + (
            [f"tile {copies}x"] if copies > 1 else [])
        table.add_row(str(rank), str(first), str(t["block_n"]), str(t["num_stages"]),
                      str(t["num_warps"]), fmt_time(r["time_s"]),
                      f"{r['achieved']['convention_tflops']:.1f}",
                      fmt_bytes(r["bytes"]["dram_read"] + r["bytes"]["dram_write"]),
                      fmt_bytes(r["sram_peak_bytes_per_cta"]), str(r["ctas_per_sm"]),
                      r["bound"], " ".join(marks))
    notes = []
    timed = [r["time_s"] for r in results if "error" not in r]
    close = sum(t <= min(timed) * (1 + TIE) for t in timed) if timed else 0
    if close > 1:  # ties are the answer too: the choice among them is free
        notes.append(f"{close} tilings within {100 * TIE:g}% of the best")
        if ties_differ_in_block_n([(r["tiling"]["block_n"], r["time_s"], r["bound"])
                                   for r in results if "error" not in r]):
            notes.append(OPERAND_CAVEAT)
    if any(tile_copies(r) > 1 for r in results[: args.top] if "error" not in r):
        notes.append("tile Nx: the warp layout lays more warps along a tile than it has "
                     "rows, so N warps compute each of its elements (`tilesim simulate` "
                     "says which kernel)")
    if refused:
        notes.append("left out: " + "; ".join(f"{n} {r}" for r, n in refused.items()))
    if args.compiled_resources:
        notes.append(f"SRAM/CTA and CTAs/SM from the kernels compiled for "
                     f"sm_{hw.compute_capability}")
    elif any(k.get("resources") == "table" for r in results for k in r.get("kernels", ())):
        notes.append(table_note(hw))
    table.caption = "; ".join(notes) or None
    print_tables([table])


def write_heatmap(results: list[dict], path: str, decode: bool = False) -> None:
    """Best time per (block_m, block_n) cell (split_kv for decode), best cell marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from simulator.explain.common import save_figure

    rows_key = "split_kv" if decode else "block_m"
    ok = [r for r in results if "error" not in r]
    if not ok:
        raise ProblemError("nothing to plot: every tiling failed")
    ys = sorted({r["tiling"][rows_key] for r in ok})
    xs = sorted({r["tiling"]["block_n"] for r in ok})
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in ok:
        i, j = ys.index(r["tiling"][rows_key]), xs.index(r["tiling"]["block_n"])
        value = r["time_s"] * 1e6
        grid[i, j] = value if np.isnan(grid[i, j]) else min(grid[i, j], value)
    best = ok[0]["tiling"]
    fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 3, 0.9 * len(ys) + 2))
    image = ax.imshow(grid, cmap="viridis_r", origin="lower", aspect="auto")
    fig.colorbar(image, ax=ax, label="best predicted time (µs)")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel("block_n")
    ax.set_ylabel(rows_key)
    middle = np.nanmin(grid) + 0.5 * (np.nanmax(grid) - np.nanmin(grid))
    for i in range(len(ys)):
        for j in range(len(xs)):
            if not np.isnan(grid[i, j]):  # dark text on the light (fast) cells
                ax.text(j, i, f"{grid[i, j]:.4g}", ha="center", va="center", fontsize=8,
                        color="black" if grid[i, j] < middle else "white")
    bi, bj = ys.index(best[rows_key]), xs.index(best["block_n"])
    ax.add_patch(plt.Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red",
                               linewidth=3))
    ax.set_title(f"best: {rows_key}={best[rows_key]} block_n={best['block_n']} "
                 f"stages={best['num_stages']} warps={best['num_warps']} "
                 f"({ok[0]['time_s'] * 1e6:.4g} µs)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
