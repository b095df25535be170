"""`tilesim calibrate RECORDS... --hardware h200-sxm --out h200-calibrated.toml`."""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli.records_args import add_loop_facts_args


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the model's efficiencies and overheads to records")
    p.add_argument("records", nargs="+", help="records files (JSON Lines)")
    p.add_argument("--hardware", required=True, help="base preset name or .toml path")
    p.add_argument("--out", required=True, help="the calibrated preset (.toml) to write")
    p.add_argument("--holdout", type=float, default=0.25,
                   help="fraction of shapes per schedule held out (default 0.25)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shape split")
    p.add_argument("--max-evals", type=int, default=200,
                   help="simulations of the training records at most, the finite-difference "
                        "Jacobian's included (default 200); stopped there, the fit keeps the "
                        "best point it evaluated")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes that simulate the records (default: the cores)")
    p.add_argument("--max-train-records", type=int, default=None,
                   help="fit on at most this many training records (schedule-balanced)")
    p.add_argument("--train-max-seq", type=int, default=None,
                   help="fit only on training shapes up to this sequence length (simulation "
                        "time grows with it); held-out shapes keep every length")
    add_loop_facts_args(p)
    p.add_argument("--json", action="store_true", help="print the fit report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from simulator.cli.common import (
        check_counts,
        check_output_paths,
        cores,
        print_json,
        write_atomically,
    )
    from simulator.cli.records_args import fill_loop_facts_as_asked, read_records_or_fail
    from simulator.hardware import PRESET_DIR, load_hardware
    from traces.problem import ProblemError
    from validation import predict
    from validation.calibrate import fit
    from validation.calibrated_preset import calibrated_toml, record_sources

    if not 0 < args.holdout < 1:
        raise ProblemError(f'"--holdout" must be in (0, 1), got {args.holdout}')
    check_counts(("--max-evals", args.max_evals), ("--jobs", args.jobs),
                 ("--max-train-records", args.max_train_records),
                 ("--train-max-seq", args.train_max_seq))
    out = Path(args.out)
    if out.suffix != ".toml":
        raise ProblemError(f"--out must be a .toml file, got {out}")
    check_output_paths(out)
    base = load_hardware(args.hardware)
    base_path = Path(args.hardware)
    if not (base_path.suffix == ".toml" or base_path.exists()):
        base_path = PRESET_DIR / f"{args.hardware}.toml"
    records, _ = read_records_or_fail(args.records)
    records, filled = fill_loop_facts_as_asked(records, args, "calibrate")
    report = fit(records, base, predict.predict, args.holdout, args.seed, args.max_evals,
                 jobs=args.jobs or cores(), max_train_records=args.max_train_records,
                 train_max_seq=args.train_max_seq,
                 warn=lambda line: sys.stderr.write(f"tilesim: warning: {line}\n"),
                 progress=lambda line: print(f"tilesim: calibrate: {line}", file=sys.stderr,
                                             flush=True))
    report["loop_facts_filled"] = filled
    report["loop_facts_as_recorded"] = args.as_recorded
    text = calibrated_toml(base_path.read_text(), report, out.stem, record_sources(args.records))
    write_atomically(out, lambda tmp: tmp.write_text(text))
    load_hardware(out)  # the written preset must load
    report = dict(report, hardware=report["hardware"].name, out=str(out))
    if args.json:
        print_json(report)
        return 0
    from rich.table import Table

    from simulator.cli.common import output_console

    console = output_console()
    t = Table(title=f"calibrated {report['base']} -> {out}", title_justify="left")
    for col in ("parameter", "base", "fitted", ""):
        t.add_column(col, justify="left" if col in ("parameter", "") else "right")
    for p in report["params"]:
        t.add_row(p["field"], f"{p['base']:.4g}", f"{p['fitted']:.4g}",
                  "at bound" if p["at_bound"] else "")
    console.print(t)
    for part in ("train", "held_out"):
        b, a = report[part]["before"], report[part]["after"]
        console.print(f"{part.replace('_', '-')}: {a['n']} records, time MAPE "
                      f"{_f(b['mape_pct'])} -> {_f(a['mape_pct'])}, max {_f(b['max_pct'])} -> "
                      f"{_f(a['max_pct'])}")
    unused = report["unused_train_shapes"]
    console.print(f"{len(report['train_shapes'])} training shapes, "
                  f"{len(report['held_out_shapes'])} held out"
                  f"{f', {len(unused)} left out of the fit' if unused else ''}; "
                  f"{report['evaluations']} evaluations ({report['message']})")
    return 0


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}%"
