"""What tilesim's table of compiles (kernels/table.py) changes for a user without Triton.

Run from the repository root:
    python benchmarks/kernel_table.py [--jobs 2] [--only estimated|table]
        [--schedule fa2 --schedule naive --schedule decode]

Predicts every FA2 record (forward and backward), naive record (forward) and decode
record of the H200 matrix (validation/records/h200-default-2026-11-30.jsonl), the
schedules the table covers (``--schedule`` picks some), twice, as `tilesim simulate` does
without
`--compiled-resources`: with the registers estimated from the tiles
(`--estimated-resources`, what it did before the table) and with the table's compile facts
(what it does now), L2 as `do_bench` left it in both, as reconcile does. Prints time MAPE,
max error, and per shape the Spearman correlation of the tilings and the regret of the
predicted best (validation.reconcile's statistics).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.cli.common import table_compiled  # noqa: E402
from validation import predict as predict_mod  # noqa: E402
from validation.reconcile import TARGETS, ranking, reconcile  # noqa: E402
from validation.records import read_records  # noqa: E402

RECORDS = REPO / "validation" / "records" / "h200-default-2026-11-30.jsonl"
SCHEDULES = ("fa2", "naive", "decode")  # those the table covers


def predict_estimated(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
    """Registers from the tiles: what `simulate --estimated-resources` knows."""
    return predict_mod.predict(problem, tiling, schedule, hw, None, l2_start)


def predict_from_table(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
    """The table's compile facts: what `simulate` knows now without a compiler."""
    return predict_mod.predict(problem, tiling, schedule, hw,
                               table_compiled(problem, tiling, schedule, hw), l2_start)


def summary(report: dict, group: str) -> str:
    time = report["summary"]["per_group"][group]["time"]
    r = ranking([s for s in report["shapes"] if s["shape"].startswith(group)])
    return (f"time MAPE {time['mape_pct']:.1f}%, max {time['max_pct']:.1f}%; Spearman >= "
            f"{TARGETS['spearman_min']:g} on {r['spearman_at_target']} of {r['n_shapes']} "
            f"shapes; regret <= {TARGETS['regret_max_pct']:g}% on "
            f"{r['regret_at_target']} (mean {r['regret_mean_pct']:.2f}%, max "
            f"{r['regret_max_pct']:.1f}%)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=("estimated", "table"),
                        help="one of the two predictions (default: both)")
    parser.add_argument("--schedule", action="append", choices=SCHEDULES,
                        help="only these schedules' records (repeatable; default: all three)")
    args = parser.parse_args()
    schedules = args.schedule or SCHEDULES
    records, _ = read_records(RECORDS)
    covered = [r for r in records if r.get("implementation") == "triton"
               and r.get("schedule") in schedules and r["problem"]["dtype"] == "bf16"]
    print(f"{len(covered)} records of {', '.join(schedules)}")
    for label, predictor in (("estimated registers", predict_estimated),
                             ("table of compiles", predict_from_table)):
        if args.only and not label.startswith(args.only):
            continue
        report = reconcile(covered, predictor=predictor, jobs=args.jobs)
        for group in sorted(report["summary"]["per_group"]):
            print(f"{group}, {label}: {summary(report, group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
