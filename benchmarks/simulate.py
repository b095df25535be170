"""Speed of the timing simulator: `tilesim simulate` and `tilesim sweep` end to end, and scaling.

Run from the repository root:  python benchmarks/simulate.py [--quick]
Prints Markdown for the "Simulator" section of BENCHMARKS.md. Targets (issue 3), process
start to exit, median of several runs on the 2-core development machine:
- simulate fa2 fwd, h100-sxm5, B=4 H=32 N=8192 d=128 bf16: <= 2 s;
- simulate fa2 fwd, B=1 H=32 N=131072 d=128 causal: <= 10 s;
- sweep of >= 48 tilings at B=4 H=32 N=8192 d=128: <= 60 s;
and the events per second and the growth of wall time with N from 1k to 128k (the fitted
exponent must be well below 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.hardware import load_hardware  # noqa: E402
from simulator.sim import run  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402

FA2_8K = ["--batch", "4", "--heads", "32", "--seq", "8192", "--head-dim", "128"]
FA2_128K = ["--batch", "1", "--heads", "32", "--seq", "131072", "--head-dim", "128", "--causal"]
SWEEP = [*FA2_8K, "--block-m", "32,64,128,256", "--block-n", "32,64,128", "--stages", "1,2,3",
         "--warps", "4,8"]


def cli(argv: list[str], repeats: int) -> tuple[float, dict | None]:
    """Median seconds of ``python -m simulator ARGV`` (start to exit) and its last JSON."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "simulator", *argv], cwd=REPO, check=True,
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if "--json" in argv:
            out = json.loads(done.stdout)
    return statistics.median(times), out


def scaling(hw) -> list[tuple[int, str, float, int, int]]:
    """In-process wall time of the simulation for causal fa2 fwd, B=1 H=32 d=128, N = 1k..128k."""
    for mode in ("full", "aggregated"):  # load the compiled code once
        run(AttentionProblem(1, 2, 256, 128), Tiling(), "fa2", hw, mode)
    rows = []
    for n in (1024 * 2 ** k for k in range(8)):
        start = time.perf_counter()
        sim = run(AttentionProblem(1, 32, n, 128, causal=True), Tiling(), "fa2", hw)
        wall = time.perf_counter() - start
        rows.append((n, sim.mode, wall, sim.events, sum(r.tile_accesses for r in sim.runs)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run each, no sweep")
    args = parser.parse_args()
    repeats = 1 if args.quick else 5
    hw = load_hardware("h100-sxm5")

    rows = []
    t8k, p8k = cli(["simulate", *FA2_8K, "--json"], repeats)
    rows.append(("`simulate` fa2 fwd B=4 H=32 N=8192 d=128", f"{t8k:.2f} s", "<= 2 s",
                 f"{p8k['simulation']['mode']}, {p8k['time_s'] * 1e3:.3f} ms predicted, "
                 f"{p8k['bound']}-bound"))
    t128k, p128k = cli(["simulate", *FA2_128K, "--json"], max(1, repeats - 2))
    rows.append(("`simulate` fa2 fwd causal B=1 H=32 N=131072 d=128", f"{t128k:.2f} s",
                 "<= 10 s", f"{p128k['simulation']['mode']}, "
                 f"{p128k['simulation']['tile_accesses'] / 1e6:.0f} M tiles through L2, "
                 f"{p128k['time_s'] * 1e3:.1f} ms predicted"))
    if not args.quick:
        tsweep, psweep = cli(["sweep", *SWEEP, "--json"], 3)
        legal = len(psweep["results"])
        rows.append((f"`sweep` {legal} tilings, B=4 H=32 N=8192 d=128", f"{tsweep:.1f} s",
                     "<= 60 s", f"{os.cpu_count()} worker processes, "
                     f"{tsweep / legal:.2f} s per tiling"))

    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; medians of {repeats} runs.\n")
    print("| what | measured | target | notes |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")

    table = scaling(hw)
    n = np.array([r[0] for r in table], dtype=float)
    wall = np.array([r[2] for r in table])
    slope = np.polyfit(np.log(n), np.log(wall), 1)[0]
    top = np.polyfit(np.log(n[-3:]), np.log(wall[-3:]), 1)[0]
    print("\nWall time of `simulator.sim.run()` (in process, compiled code loaded) for causal fa2 "
          "fwd, B=1 H=32 d=128:\n")
    print("| N | engine | wall | events | events/s | tiles through L2 | tiles/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size, mode, w, events, tiles in table:
        print(f"| {size} | {mode} | {w:.3f} s | {events:,} | {events / w:,.0f} | {tiles:,} | "
              f"{tiles / w:,.0f} |")
    print(f"\nFitted exponent of wall time in N, 1k..128k: **{slope:.2f}**; over 32k..128k: "
          f"{top:.2f} (the simulated work itself, tiles through L2, grows as N^2).")


if __name__ == "__main__":
    main()
