"""Time `tilesim simulate` on this tree and on another checkout, interleaved, for ratios.

Run from the repository root, with an older commit checked out beside it:

    git worktree add /tmp/old <commit>
    python benchmarks/side_by_side.py --old /tmp/old [--repeats 3] [--case naive-16k ...]

Each case runs ``python -m simulator simulate ... --json`` as a fresh process (start to
exit: imports and numba's cache loads included) alternately on the old tree and on this
one, so that both see the same machine load; the script prints the medians, their ratio,
and whether the two predicted the same time (a pure speed change must not move it). One
warm-up run per tree and case comes first and is not counted: after a change to a
compiled module, numba recompiles once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NAIVE = ["--hardware", "h200-sxm", "--schedule", "naive", "--heads", "16", "--head-dim", "64",
         "--block-m", "64", "--block-n", "64"]
CASES = {
    # the headline `simulate` (BENCHMARKS.md, "Simulator"): its kernel is in the table
    "fa2-8k": ["--hardware", "h100-sxm5", "--batch", "4", "--heads", "32", "--seq", "8192",
               "--head-dim", "128"],
    "naive-4k": [*NAIVE, "--batch", "4", "--seq", "4096"],
    "naive-16k": [*NAIVE, "--batch", "1", "--seq", "16384"],
    # the validation plan's N = 1k shape and a quarter of it: QK 62 and 16 waves, softmax
    # 124 and 31 (fluid._jobs merges above MAX_JOBS_PER_SLOT)
    "naive-1k-b16": [*NAIVE, "--batch", "16", "--seq", "1024"],
    "naive-1k-b4": [*NAIVE, "--batch", "4", "--seq", "1024"],
    # its default tiling from the table: 10 softmax CTAs an SM, every SM free (fairshare)
    "naive-4k-d128": ["--hardware", "h200-sxm", "--schedule", "naive", "--batch", "1",
                      "--heads", "16", "--seq", "4096", "--head-dim", "128"],
    "fa2-128k-causal": ["--batch", "1", "--heads", "32", "--seq", "131072", "--head-dim",
                        "128", "--causal"],
    # key lengths off the tile widths: S and P read back by whole rows of 1000 and 3001
    # keys (their L2 blocks, ``l2.BlockLayout.from_schedule``)
    "naive-1000": [*NAIVE, "--batch", "1", "--seq", "1000"],
    "naive-3001": [*NAIVE, "--batch", "1", "--seq", "3001"],
}


def simulate(tree: Path, argv: list[str]) -> tuple[float, float]:
    """(wall seconds, predicted time) of one `simulate` process on ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "simulator", "simulate", *argv, "--json"],
                          cwd=tree, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start, json.loads(done.stdout)["time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, type=Path, help="the other checkout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="cases to run (default: all)")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": REPO}
    print("| case | old | new | old / new | same prediction |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.case or list(CASES):
        walls: dict[str, list[float]] = {"old": [], "new": []}
        predicted = {}
        for label, tree in trees.items():  # warm-up: numba may recompile after a change
            predicted[label] = simulate(tree, CASES[name])[1]
        for _ in range(args.repeats):
            for label, tree in trees.items():
                walls[label].append(simulate(tree, CASES[name])[0])
        old, new = statistics.median(walls["old"]), statistics.median(walls["new"])
        same = "yes" if predicted["old"] == predicted["new"] else (
            f"no: {predicted['old']:.6g} s vs {predicted['new']:.6g} s")
        print(f"| {name} | {old:.2f} s | {new:.2f} s | {old / new:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
