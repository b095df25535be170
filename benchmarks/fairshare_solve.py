"""Time the fair-share solve alone (``simulator.sim.fairshare.fair_rates``) on replicas of
the aggregated engine's events, on this tree and optionally on another checkout.

Run from the repository root:

    python benchmarks/fairshare_solve.py [--old <checkout>] [--repeats 3] [--calls 20000]

Each case is a replica of one event after another on the H200 (132 SMs): every call
changes one slot's critical path by a part in ten million and marks its SM changed, as a
phase ending does, with HBM limiting the answer throughout (``state`` stays -1: the joint
solve runs at every call). The cases differ in how many SMs are free (their slots at
their critical paths' pace want no more than the SM's port gives; ``fairshare``):

- ``softmax``: 1,321 slots (10 CTAs an SM and the write-back flow, as naive attention's
  softmax from the table of compiles), no compute, every SM free;
- ``mixed``: the same slots behind a port a tenth as wide: 37 SMs free, 95 busy;
- ``busy``: 397 slots (3 an SM) with compute, every SM busy.

Each (tree, case) runs in a process of its own (numba's cache warmed by a first call),
the trees alternately, and the script prints the median microseconds per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    # slots, port bytes/s, whether the slots compute
    "softmax": (1321, 1e13, False),
    "mixed": (1321, 1e11, False),
    "busy": (397, 1e11, True),
}

_REPLICA = textwrap.dedent("""
    import inspect, sys, time
    import numpy as np
    from simulator.sim.fairshare import ROWS, fair_rates
    slots, port, compute, calls = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", \\
        int(sys.argv[4])
    n_sm, l2, hbm = 132, 10e12, 4.3e12 if not compute else 1e12
    rng = np.random.default_rng(0)
    B = rng.choice([0.0, 32768.0, 65536.0], slots)
    M = B.copy() if not compute else 0.5 * B
    K = rng.uniform(1e-6, 3e-6, slots) if compute else np.zeros(slots)
    CP = rng.uniform(2e-6, 4e-6, slots)
    levels, w = np.zeros((2, n_sm)), np.zeros((ROWS, slots))
    rate, limit = np.zeros(slots), np.zeros(slots, dtype=np.int64)
    dirty, state = np.ones(n_sm, dtype=np.bool_), np.zeros(3)
    # the solver before free SMs were skipped took no ``free``
    free = ([np.zeros(n_sm, dtype=np.bool_)]
            if "free" in inspect.signature(fair_rates.py_func).parameters else [])
    args = lambda: (B, M, K, CP, n_sm, l2, hbm, port, levels[0], levels[1], w, rate, limit,
                    dirty, *free, state)
    fair_rates(*args())
    assert state[0] == -1.0, "HBM must limit every answer"
    start = time.perf_counter()
    for k in range(calls):
        s = k % slots
        CP[s] *= 1.0000001
        dirty[s % n_sm] = True
        fair_rates(*args())
    print(1e6 * (time.perf_counter() - start) / calls, int(free[0].sum()) if free else -1)
    """)


def solve_us(tree: Path, case: str, calls: int) -> tuple[float, int]:
    """Microseconds per ``fair_rates`` call of one replica on ``tree``, and its free SMs
    (-1 where the solver keeps none)."""
    slots, port, compute = CASES[case]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", _REPLICA, str(slots), str(port),
                           "1" if compute else "0", str(calls)], cwd=tree, env=env,
                          check=True, capture_output=True, text=True)
    us, free = done.stdout.split()[-2:]
    return float(us), int(free)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    trees = {"new": REPO} if args.old is None else {"old": args.old.resolve(), "new": REPO}
    print("| case | slots | free SMs | " + " | ".join(f"{label} (µs a call)" for label in trees)
          + (" | old / new |" if args.old else " |"))
    print("| --- | --- | --- | " + " | ".join("---" for _ in trees)
          + (" | --- |" if args.old else " |"))
    for case in CASES:
        times: dict[str, list[float]] = {label: [] for label in trees}
        for _ in range(args.repeats):
            for label, tree in trees.items():
                us, free = solve_us(tree, case, args.calls)
                times[label].append(us)
                if label == "new":
                    free_sms = free
        medians = {label: statistics.median(t) for label, t in times.items()}
        cells = " | ".join(f"{medians[label]:.1f}" for label in trees)
        ratio = f" | {medians['old'] / medians['new']:.2f} |" if args.old else " |"
        print(f"| {case} | {CASES[case][0]} | {free_sms} | {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
