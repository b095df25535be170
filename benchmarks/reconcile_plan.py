"""How long `tilesim reconcile` takes on a whole plan: what a GPU session waits for.

Run from the repository root:  python benchmarks/reconcile_plan.py [--plan default] [--jobs 2]

Reconcile predicts every measured config with the simulator, and that, not the comparison,
is its cost. This script writes one SYNTHETIC record per config of the frozen plan (the
test fixtures' format, labelled synthetic; the "measured" time is the plan's expected
time, which does not matter here) and times `tilesim reconcile --jobs N --summary-only` on
them, start to exit. Prints the wall time and the records per schedule.
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

from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation.matrix import load_plan  # noqa: E402
from validation.records import write_records  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="default", help="plan name or .json path")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    plan = load_plan(args.plan)
    records = [record(c["schedule"], AttentionProblem.from_dict(c["problem"]),
                      Tiling.from_dict(c["tiling"]), c["est_time_s"]) for c in plan["configs"]]
    per_schedule = collections.Counter(f"{c['schedule']} {c['problem']['pass']}"
                                       for c in plan["configs"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.jsonl"
        write_records(path, records)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simulator", "reconcile", str(path), "--jobs",
                        str(args.jobs), "--summary-only"], cwd=REPO, check=True,
                       capture_output=True)
        wall = time.perf_counter() - start
    print(f"reconcile of plan {plan['name']} ({plan['sha256']}): {len(records)} records "
          f"({', '.join(f'{n} {s}' for s, n in sorted(per_schedule.items()))}), "
          f"--jobs {args.jobs}: {wall:.0f} s ({wall / 60:.1f} min)")


if __name__ == "__main__":
    main()
