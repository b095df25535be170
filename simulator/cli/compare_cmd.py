"""`tilesim compare`: naive attention and FlashAttention-2 side by side on one problem."""

from __future__ import annotations

from simulator.cli.common import (
    add_hardware_arg,
    add_problem_args,
    add_tiling_args,
    hardware_from_args,
    print_json,
    problem_from_args,
    tiling_that_fits,
)
from simulator.cli.resources_args import add_compiled_arg, compiled_from_args, table_note


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="naive attention vs FlashAttention-2, side by side")
    add_hardware_arg(p)
    add_problem_args(p, schedule=False)
    add_tiling_args(p)
    p.add_argument("--json", action="store_true", help="print both predictions as JSON")
    add_compiled_arg(p)
    p.set_defaults(func=run)


def render(preds: dict, hw) -> None:
    from rich.table import Table

    from simulator.cli.common import output_console
    from simulator.cli.render import fmt_bytes, fmt_count, fmt_time, spill_notes

    naive, fa2 = preds["naive"], preds["fa2"]
    table = Table(title=f"naive vs FlashAttention-2 on {fa2['hardware']}", title_justify="left")
    table.add_column("")
    for name in preds:
        table.add_column(name, justify="right")
    table.add_column("naive / fa2", justify="right")

    def ratio(a, b):
        return f"{a / b:,.1f}x" if a is not None and b else "-"

    def row(label, key, fmt):
        a, b = key(naive), key(fa2)
        table.add_row(label, fmt(a), fmt(b), ratio(a, b))

    row("time", lambda p: p["time_s"], fmt_time)
    row("global (L2) read", lambda p: p["bytes"]["global_read"], fmt_bytes)
    row("global (L2) write", lambda p: p["bytes"]["global_write"], fmt_bytes)
    if any(p["bytes"].get(k) for p in (naive, fa2) for k in ("local_read", "local_write")):
        # a compile's spills beyond L1 (simulator.spills): L2 traffic beside the tiles'
        for label, key in (("spills through L2 read", "local_read"),
                           ("spills through L2 write", "local_write")):
            a, b = naive["bytes"][key], fa2["bytes"][key]
            table.add_row(label, fmt_bytes(a), fmt_bytes(b), ratio(a, b) if a else "-")
    row("DRAM read", lambda p: p["bytes"]["dram_read"], fmt_bytes)
    row("DRAM write", lambda p: p["bytes"]["dram_write"], fmt_bytes)
    row("intermediates written (S, P, LSE)", _intermediate_bytes, fmt_bytes)
    row("tensor FLOPs", lambda p: p["flops"]["tensor"], fmt_count)
    row("kernels", lambda p: len(p["kernels"]), str)
    row("device memory (all tensors)", lambda p: p["device_memory_bytes"], fmt_bytes)
    table.add_row("bound", *(str(p["bound"]) if p["time_s"] is not None else "not timed"
                             for p in (naive, fa2)), "")
    tflops = [p["flops"]["convention"] / p["time_s"] / 1e12 if p["time_s"] else None
              for p in (naive, fa2)]
    table.add_row("TFLOP/s (paper convention)",
                  *(f"{t:,.0f}" if t is not None else "-" for t in tflops), "")
    if all(k.get("resources") == "compiled" for p in (naive, fa2) for k in p["kernels"]):
        table.caption = "occupancy from the compiled kernels' registers and shared memory"
    elif any(k.get("resources") == "table" for p in (naive, fa2) for k in p["kernels"]):
        shipped = [p["schedule"] for p in (naive, fa2)
                   if all(k.get("resources") == "table" for k in p["kernels"])]
        table.caption = f"{', '.join(shipped) or 'some kernels'}: {table_note(hw)}"
    console = output_console()
    console.print(table)
    for name in preds:
        if "note" in preds[name]:
            console.print(f"{preds[name]['note']}; its traffic is counted, not timed.",
                          markup=False)
    for line in spill_notes(preds):
        console.print(line, markup=False)


def _intermediate_bytes(pred: dict) -> int:
    """Bytes a schedule writes to tensors other than Q, K, V and O (S and P, or LSE)."""
    return sum(t["global_write"] for name, t in pred["per_tensor"].items()
               if name not in ("q", "k", "v", "o"))


def run(args) -> int:
    from simulator.explain.model import PAIR, predict_pair

    hw = hardware_from_args(args)
    problem = problem_from_args(args)
    tiling, tiling_note = tiling_that_fits(args, problem, PAIR, hw)
    compiled = {name: compiled_from_args(args, problem, tiling, name, hw) for name in PAIR}
    preds = predict_pair(problem, tiling, hw, compiled)
    if args.json:
        print_json(preds)
    else:
        if tiling_note:
            print(tiling_note)
        render(preds, hw)
    return 0
