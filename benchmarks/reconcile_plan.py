"""What a GPU session waits for after the device run: reconcile and calibration steps.

Run from the repository root:
    python benchmarks/reconcile_plan.py [--plan default] [--jobs 2] [--skip-reconcile]

Reconcile predicts every measured config with the simulator, and that, not the comparison,
is its cost. This script writes one SYNTHETIC record per config of the frozen plan (the
test fixtures' format, labelled synthetic; the "measured" time is the plan's expected
time, which does not matter here) and times `tilesim reconcile --jobs N --summary-only` on
them, start to exit. Then it times one evaluation of `tilesim calibrate` — predicting the
training subset that `--train-max-seq` and `--max-train-records` leave (taken as calibrate
takes it: the shape split, the length filter, the balanced subsample) — in processes, as
calibrate does; a fit costs its number of evaluations times that.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from synthetic_records import record  # noqa: E402

from simulator.hardware import load_hardware  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation.calibrate import (  # noqa: E402
    predicted_times,
    sequence_length,
    split_by_shape,
    subsample,
)
from validation.plan_file import load_plan  # noqa: E402
from validation.predict import predict  # noqa: E402
from validation.records import shape_key, write_records  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="default", help="plan name or .json path")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-reconcile", action="store_true")
    parser.add_argument("--train-max-seq", type=int, default=4096)
    parser.add_argument("--max-train-records", type=int, default=40)
    args = parser.parse_args()
    plan = load_plan(args.plan)
    records = [record(c["schedule"], AttentionProblem.from_dict(c["problem"]),
                      Tiling.from_dict(c["tiling"]), c["est_time_s"]) for c in plan["configs"]]
    per_schedule = collections.Counter(f"{c['schedule']} {c['problem']['pass']}"
                                       for c in plan["configs"])
    if not args.skip_reconcile:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "synthetic.jsonl"
            write_records(path, records)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "simulator", "reconcile", str(path),
                            "--jobs", str(args.jobs), "--summary-only"], cwd=REPO,
                           check=True, capture_output=True)
            wall = time.perf_counter() - start
        print(f"reconcile of plan {plan['name']} ({plan['sha256']}): {len(records)} records "
              f"({', '.join(f'{n} {s}' for s, n in sorted(per_schedule.items()))}), "
              f"--jobs {args.jobs}: {wall:.0f} s ({wall / 60:.1f} min)")
    train_shapes, _ = split_by_shape(records)
    train = subsample([r for r in records if shape_key(r) in train_shapes
                       and sequence_length(r) <= args.train_max_seq],
                      args.max_train_records)
    hw = load_hardware(plan["hardware"])
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        predicted_times(train[:args.jobs], hw, predict, pool)  # start workers, load caches
        start = time.perf_counter()
        predicted_times(train, hw, predict, pool)
        wall = time.perf_counter() - start
    groups = collections.Counter(r["schedule"] for r in train)
    print(f"one calibrate evaluation, --train-max-seq {args.train_max_seq} "
          f"--max-train-records {args.max_train_records}: {len(train)} records "
          f"({', '.join(f'{n} {s}' for s, n in sorted(groups.items()))}), --jobs {args.jobs}: "
          f"{wall:.0f} s")


if __name__ == "__main__":
    main()
