"""`tilesim validate`: run the validation matrix on a CUDA GPU and write records.

``--dry-run`` prints the plan (tilings per group, and how they were chosen) and the time
estimate of each phase; it needs no GPU. Without a CUDA GPU, a real run stops with one line
and exit code 2.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from traces.problem import ProblemError

DEFAULT_BUDGET_S = 450.0
DEVICE_WORKERS = 15  # the GPU machine has 16 cores; one is left to the parent process


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="measure the Triton kernels on a GPU (time, counters)")
    p.add_argument("--matrix", default="default",
                   help="default, quick, mlp (a decode probe), or a plan .json (see python "
                        "-m validation.matrix)")
    p.add_argument("--out", default=None, help="records file (JSON Lines, appended)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and its time estimate; runs nothing")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"time budget of the whole run (default {DEFAULT_BUDGET_S:.0f} s)")
    p.add_argument("--log-dir", default=None,
                   help="folder for summary.json, ncu.csv, ncu.log (default: --out's)")
    p.add_argument("--warmup-ms", type=float, default=10.0, help="do_bench warm-up budget")
    p.add_argument("--rep-ms", type=float, default=40.0, help="do_bench repeat budget")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel compile workers (default: CPU cores - 1, at most "
                        f"{DEVICE_WORKERS}; a dry run assumes the GPU machine's {DEVICE_WORKERS})")
    p.add_argument("--no-ncu", action="store_true", help="time only, no Nsight Compute pass")
    p.add_argument("--hardware", default="h200-sxm",
                   help="preset the tilings are chosen on, if the plan is not frozen")
    p.add_argument("--json", action="store_true", help="--dry-run: print plan and estimate")
    p.set_defaults(func=run)


def resolve_plan(matrix: str, hardware: str, log) -> dict:
    """The frozen plan if there is one, else one chosen now with the available model."""
    from validation import matrix as mx
    from validation.groups import groups_for
    from validation.plan_file import PLAN_DIR, load_plan

    path = Path(matrix)
    if path.is_dir():
        raise ProblemError(f"--matrix {matrix} is a directory; give a plan .json or a "
                           "matrix name (default, quick, mlp)")
    if path.suffix == ".json" or (PLAN_DIR / f"{matrix}.json").is_file():
        return load_plan(matrix)
    groups_for(matrix)  # unknown names fail here
    from simulator.hardware import load_hardware
    from validation import predict

    log(f"note: no frozen plan for '{matrix}'; choosing tilings now with the "
        f"{predict.model_name()} model (freeze with `python -m validation.matrix write "
        f"{matrix}`)")
    return mx.build_plan(matrix, load_hardware(hardware), predict.predict, predict.model_name())


def _require_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise ProblemError("validate needs torch and triton: pip install -e '.[kernels]'") from None
    if not torch.cuda.is_available():
        raise ProblemError("validate runs the Triton kernels on a CUDA GPU and none is visible "
                           "here; `tilesim validate --dry-run` shows the plan and its time "
                           "estimate")


def _print_dry_run(plan: dict, est: dict, budget_s: float) -> None:
    from rich.table import Table

    from simulator.cli.common import output_console
    from validation import predict

    console = output_console()
    tilings = Table(title=f"matrix '{plan['name']}': tilings chosen by {plan['selected_by']} "
                          f"({plan['rating']}), plan {plan['sha256']}", title_justify="left")
    for col in ("group", "N", "tilings (best rated first)"):
        tilings.add_column(col)
    groups: dict[str, dict] = {}
    for cfg in plan["configs"]:
        p, t = cfg["problem"], cfg["tiling"]
        label = (f"{cfg['schedule']} {p['pass']} d={p['head_dim']}"
                 f"{' causal' if p['causal'] else ''}")
        g = groups.setdefault(label, {"n": set(), "tilings": {}})
        g["n"].add(p["seq_kv"])
        desc = f"{t['block_m']}x{t['block_n']} s{t['num_stages']} w{t['num_warps']}" + (
            f" split {t['split_kv']}" if t["split_kv"] > 1 else "")
        g["tilings"].setdefault(desc, None)
    for label, g in groups.items():
        tilings.add_row(label, ", ".join(f"{n // 1024}k" for n in sorted(g["n"])),
                        "; ".join(g["tilings"]))
    console.print(tilings)
    for note in plan["notes"]:
        console.print(f"note: {note}")
    if plan["selected_by"] != predict.model_name():
        console.print(f"note: this plan was chosen by {plan['selected_by']}, not the simulator "
                      "now: re-freeze it with `python -m validation.matrix write "
                      f"{plan['name']}`")
    table = Table(title="time estimate on the GPU machine", title_justify="left")
    for col in ("phase", "seconds"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    for phase, seconds in est["phases"].items():
        table.add_row(phase, f"{seconds:.0f}")
    table.add_row("total", f"{est['total_s']:.0f}")
    console.print(table)
    c = est["counts"]
    console.print(f"{c['configs']} configs in {c['shapes']} shapes, {c['peers']} peers; "
                  f"{c['compile_keys']} compiles ({c['serial_compile_s']:.0f} s serial, "
                  f"{est['assumptions']['workers']} workers); {c['profiled_launches']} "
                  f"profiled launches (+{c['setup_launches']} setup) at "
                  f"{est['assumptions']['ncu_launch_s']} s each; do_bench "
                  f"{est['assumptions']['warmup_ms']:.0f}+{est['assumptions']['rep_ms']:.0f} ms")
    if c["near_ties"]:
        console.print(f"{c['near_ties']} near ties ({c['near_tie_launches']} launches) are "
                      "profiled last, if time is left: "
                      f"~{est['optional']['ncu_near_ties']:.0f} s more, not in the total")
    verdict = "fits" if est["total_s"] <= budget_s else "does NOT fit"
    console.print(f"estimate {est['total_s']:.0f} s {verdict} the budget of {budget_s:.0f} s "
                  "(the run guards its time: what does not fit is skipped and listed)")


def run(args) -> int:
    from simulator.cli.common import check_counts, cores, print_json
    from validation.estimate import estimate

    for flag, value, zero_ok in (("--budget-s", args.budget_s, False),
                                 ("--warmup-ms", args.warmup_ms, True),
                                 ("--rep-ms", args.rep_ms, False)):
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise ProblemError(f'"{flag}" must be a finite number {">=" if zero_ok else ">"} '
                               f"0, got {value}.")
    check_counts(("--workers", args.workers))
    from simulator.hardware import load_hardware

    load_hardware(args.hardware)  # an unknown preset fails here, frozen plan or not
    if not args.dry_run:
        if not args.out:
            raise ProblemError("--out records.jsonl is required (or use --dry-run)")
        out = Path(args.out)
        if not (out.parent if str(out.parent) else Path(".")).is_dir():
            raise ProblemError(f"cannot write {out}: directory {out.parent} does not exist")
        _require_gpu()
    if args.workers is None:
        args.workers = (DEVICE_WORKERS if args.dry_run
                        else max(1, min(DEVICE_WORKERS, cores() - 1)))
    plan = resolve_plan(args.matrix, args.hardware, log=lambda m: print(m, file=sys.stderr))
    est = estimate(plan, args.warmup_ms, args.rep_ms, args.workers, ncu=not args.no_ncu)
    if args.dry_run:
        if args.json:
            print_json({"plan": plan, "estimate": est, "budget_s": args.budget_s})
        else:
            _print_dry_run(plan, est, args.budget_s)
        return 0
    from validation.campaign import RunOptions
    from validation.campaign import run as run_campaign

    out = Path(args.out)
    log_dir = Path(args.log_dir) if args.log_dir else (out.parent if str(out.parent) else
                                                       Path("."))
    log_dir.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(budget_s=args.budget_s, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                      workers=args.workers, use_ncu=not args.no_ncu)
    summary = run_campaign(plan, out, log_dir, opts, log=lambda m: print(m, flush=True))
    return 0 if summary["records_written"] else 1
