"""``tilesim kernels resources``: shared memory and registers of the Triton kernels, per tiling.

Each kernel is compiled ahead of time for the chosen GPU architecture on this machine (no GPU
needed; kernels/resources.py) and the table shows what one CTA of it uses: shared memory
(bytes, from Triton's metadata), registers per thread and local-memory spill bytes (from the
cubin, via the cuobjdump in Triton's wheel), and whether the shared memory fits the
architecture's per-CTA limit. Nothing is cached in the repository; ``--out`` writes the JSON
to a file the user names.
"""

from __future__ import annotations

import argparse
import sys

from simulator.cli.common import check_counts, check_output_paths, print_json, write_atomically
from traces.problem import ProblemError

SCHEMA = "tilesim.kernel_resources/1"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernels",
        help="compile the Triton kernels ahead of time and report their resources",
        description="Facts about the Triton kernels that twin the schedules.",
    )
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="kernels_action", metavar="ACTION",
                                    parser_class=type(parser))
    actions.required = True
    res = actions.add_parser(
        "resources",
        help="shared memory and registers per kernel and tiling (ahead-of-time compile)",
        description="Compile every kernel for each tiling (all combinations of the block, "
                    "stage and warp values given) and report shared memory, registers and "
                    "spills per CTA. Compiles run in parallel, one process per core; the "
                    "full default set takes minutes.",
    )
    res.add_argument("--arch", type=int, nargs="+", choices=(80, 90), default=[90],
                     help="compute capability: 90 (H100/H200) or 80 (A100); default 90")
    res.add_argument("--head-dim", type=int, default=128)
    res.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    res.add_argument("--kernel", nargs="+", default=None, metavar="NAME",
                     help="only these kernels (default: all)")
    # Lists as `sweep` takes them ("32,64") or space-separated ("32 64").
    res.add_argument("--block-m", nargs="+", default=["64,128"])
    res.add_argument("--block-n", nargs="+", default=["32,64,128"])
    res.add_argument("--stages", nargs="+", default=["2,3,4"])
    res.add_argument("--warps", nargs="+", default=["4,8"])
    res.add_argument("--causal", action="store_true", help="compile the causal variants")
    res.add_argument("--kv-seq", type=int, default=4096,
                     help="K/V length: sets naive_softmax's row width (default 4096)")
    res.add_argument("--heads", type=int, default=None,
                     help="compile as a launch with this many query heads (and --kv-heads, "
                          "--seq): Triton makes each integer argument equal to 1, such as "
                          "the group size with as many K/V heads as query heads, a constant "
                          "of the compile (fewer registers where a loop over the group "
                          "goes). Default: the launch's integers unknown")
    res.add_argument("--kv-heads", type=int, default=None,
                     help="K/V heads of that launch (default: --heads)")
    res.add_argument("--seq", type=int, default=None,
                     help="query length of that launch (default: --kv-seq)")
    res.add_argument("--workers", type=int, default=None, help="compile processes (default: "
                     "one per core)")
    res.add_argument("--json", action="store_true", help="print JSON on stdout")
    res.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")


def _int_values(items: list[str], name: str) -> list[int]:
    """``["32,64", "128"]`` -> ``[32, 64, 128]``: comma- or space-separated integers."""
    from simulator.explain.common import parse_int_list

    return [v for item in items for v in parse_int_list(item, name.replace("_", "-"))]


def run(args: argparse.Namespace) -> int:
    try:
        import triton

        from kernels import resources
        from kernels.common import SUPPORTED_HEAD_DIMS
    except ImportError as exc:
        raise ProblemError(f"the kernels need torch and triton ({exc.name} is missing): "
                           "pip install 'tilesim[kernels]'") from None
    if args.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ProblemError(f'"head_dim" must be one of {SUPPORTED_HEAD_DIMS} for the Triton '
                           f"kernels, got {args.head_dim}.")
    if args.kv_seq <= 0:
        raise ProblemError(f'"kv_seq" must be a positive integer, got {args.kv_seq}.')
    check_counts(("--workers", args.workers), ("--heads", args.heads),
                 ("--kv-heads", args.kv_heads), ("--seq", args.seq))
    launch = _launch(args)
    check_output_paths(args.out)  # before minutes of compiling
    unknown = [k for k in args.kernel or () if k not in resources.KERNELS]
    if unknown:
        raise ProblemError(f"unknown kernel {', '.join(unknown)}; known: "
                           f"{', '.join(resources.KERNELS)}")
    tilings = resources.sweep_tilings(*(_int_values(getattr(args, name), name) for name in
                                        ("block_m", "block_n", "stages", "warps")))
    records = resources.measure(args.kernel, archs=tuple(args.arch), dtype=args.dtype,
                                head_dim=args.head_dim, tilings=tilings, workers=args.workers,
                                progress=None if args.json else _progress(),
                                causal=args.causal, seq_kv=args.kv_seq, **launch)
    doc = {"schema": SCHEMA, "triton_version": triton.__version__, "dtype": args.dtype,
           "head_dim": args.head_dim, "causal": args.causal, "launch": launch or None,
           "max_shared_bytes": {str(a): resources.MAX_SHARED_BYTES[a] for a in args.arch},
           "kernels": [r.to_dict() for r in records]}
    if args.out:
        import json

        write_atomically(args.out, lambda p: p.write_text(json.dumps(doc, indent=2) + "\n"))
    if args.json:
        print_json(doc)
    else:
        _print_table(records, args)
    failed = [r for r in records if r.error]
    for r in failed:
        sys.stderr.write(f"tilesim: {r.kernel} sm_{r.arch} BM={r.block_m} BN={r.block_n} "
                         f"stages={r.num_stages} warps={r.num_warps}: {r.error}\n")
    return 1 if failed else 0


def _launch(args: argparse.Namespace) -> dict:
    """The launch's integers ``measure`` specializes on (``kernels.resources.launch_ints``):
    none without ``--heads``; ``ProblemError`` for K/V heads that do not divide the heads
    or launch options without ``--heads``."""
    if args.heads is None:
        if args.kv_heads is not None or args.seq is not None:
            raise ProblemError("--kv-heads and --seq describe the launch --heads starts; "
                               "give --heads too")
        return {}
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if args.heads % kv_heads:
        raise ProblemError(f"--kv-heads {kv_heads} must divide --heads {args.heads}")
    from kernels.resources import launch_shape

    return launch_shape(args.kv_seq if args.seq is None else args.seq, args.heads,
                        args.heads // kv_heads)


def _progress():
    """A progress callback drawing a bar on stderr, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("compiling", total=total)
        bar.update(task, completed=done)
        if done == total:
            bar.stop()

    return update


def _mma_kind(r) -> str:
    """Which tensor-core instruction the kernel's matmuls compiled to."""
    kinds = [name for name, n in (("wgmma", r.wgmma_ops), ("mma.sync", r.mma_sync_ops)) if n]
    if r.wgmma_ops and r.wgmma_rs_ops is not None:  # where A comes from: smem, registers
        kinds[0] += f" {r.wgmma_ops - r.wgmma_rs_ops} SS/{r.wgmma_rs_ops} RS"
    return "+".join(kinds) or "-"


def _spill_per_iteration(r) -> str:
    """Spilled bytes per thread loaded / stored by one main-loop iteration, and the times a
    warp waits for the reloads (``L/S (W waits)``), or '-'."""
    loaded, stored = r.spill_load_bytes_per_iteration, r.spill_store_bytes_per_iteration
    if loaded is None or stored is None:
        return "-"
    if not (loaded or stored):
        return "0"
    waits = r.spill_reload_waits
    return f"{loaded}/{stored}" + ("" if waits is None else
                                   f" ({waits} wait{'' if waits == 1 else 's'})")


def _instructions(r) -> str:
    """A warp's instructions per iteration of the main loop, then "+P/E" those outside its
    loops (before the first, after it), or "N (all)" in a kernel without loops; "-" where
    none is known."""
    if r.loop_instructions:
        around = (f" +{r.prologue_instructions}/{r.epilogue_instructions}"
                  if r.prologue_instructions is not None else "")
        return f"{r.loop_instructions}{around}"
    return f"{r.straight_instructions} (all)" if r.straight_instructions else "-"


def _print_table(records, args: argparse.Namespace) -> None:
    from rich.table import Table

    from simulator.cli.common import output_console

    launch = (f", launched with {args.heads} heads / {args.kv_heads or args.heads} K/V heads, "
              f"Nq {args.seq or args.kv_seq}" if args.heads
              else ", launch integers unknown (--heads to specialize)")
    title = (f"Triton kernels, {args.dtype}, head_dim {args.head_dim}"
             f"{', causal' if args.causal else ''}{launch}: resources per CTA")
    limit = _operand_limit(args.dtype)
    table = Table(title=title, title_justify="left")
    for col in ("kernel", "arch", "BM", "BN", "stages", "warps", "smem bytes", "registers",
                "spill bytes", "spill B/iter", "instr", "mma", "operand B/FLOP", "fits"):
        table.add_column(col, justify="left" if col == "kernel" else "right", no_wrap=True)
    for r in records:
        if r.error:
            tail = ["-", "-", "-", "-", "-", "-", "-", "[red]error[/red]"]
        else:
            tail = [f"{r.shared_bytes:,}", str(r.registers or "-"), str(r.spill_bytes or 0),
                    _spill_per_iteration(r), _instructions(r), _mma_kind(r),
                    _operand_demand(r, limit),
                    "yes" if r.fits else "[red]NO[/red]"]
        table.add_row(r.kernel, f"sm_{r.arch}", str(r.block_m), str(r.block_n),
                      str(r.num_stages), str(r.num_warps), *tail)
    if any(r.wgmma_smem_bytes_per_flop for r in records):
        table.caption = (f"operand B/FLOP: bytes the wgmma read from shared memory per tensor "
                         "FLOP, over the kernel's mix of matmuls / its most demanding one; "
                         f"above {limit:.3f} (128 B/clk for 4096 FLOP/clk per SM) the "
                         "reads, not the tensor cores, set the pace at peak (*); the simulator "
                         "does not charge them (docs/model.md)")
    note = ("instr: instructions a warp issues per iteration of the main loop (+ outside "
            "its loops: before the first / after it), or in all in a kernel without loops "
            "(SASS)"
            + ("; spill bytes: local memory per thread (ptxas's stack frame); spill B/iter: "
               "bytes per thread the main loop loads / stores from it every iteration (and "
               "the times a warp waits for the reloads, an L2 round trip each in the model)"
               if any(r.spill_bytes for r in records if not r.error) else ""))
    table.caption = f"{table.caption}\n{note}" if table.caption else note
    output_console(width=170).print(table)


def _operand_limit(dtype: str) -> float:
    """What an sm_90 SM's shared memory can feed its tensor cores, bytes per FLOP (wgmma
    exists on sm_90 only; the H100 SXM5 preset's numbers)."""
    from simulator.hardware import load_hardware

    return load_hardware("h100-sxm5").smem_operand_limit(dtype)


def _operand_demand(r, limit: float) -> str:
    """"mix / most demanding" operand bytes per FLOP, starred where one exceeds the limit."""
    mix, worst = r.wgmma_smem_bytes_per_flop, r.wgmma_smem_bytes_per_flop_max
    if mix is None:
        return "-"
    return f"{mix:.3f} / {worst:.3f}" + (" *" if worst > limit else "")

