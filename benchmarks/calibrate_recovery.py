"""Does `tilesim calibrate` find known parameters? Records the simulator itself "measured".

Run from the repository root:
    python benchmarks/calibrate_recovery.py [--jobs 2] [--diff-step 1e-2 ...]

Forty-five configurations (fa2 forward, causal and backward, naive, decode; N = 1k-4k, the
default matrix's sizes) are predicted by the simulator on the h200-sxm preset with every
fitted parameter changed to a known value (seven since 2026-11-30; six before, the exp rate
among them); those times are written as SYNTHETIC records. Then the
fit starts from the preset's values, as calibrate does, and the script prints how many
simulator evaluations it took, the parameters it found against the known ones, and the
train and held-out time MAPE (both 0 at the known parameters). A fit that stalls far from
them here would stall on real records too. The pass over several finite-difference steps
is how `validation.calibrate.DIFF_STEP` was chosen.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from synthetic_records import record  # noqa: E402

import validation.calibrate as calibrate  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation.predict import map_tasks, predict  # noqa: E402


def known_hardware(base):
    """The preset with every fitted parameter moved well away from its value."""
    return dataclasses.replace(
        base, hbm_efficiency=0.75, l2_efficiency=0.55, tensor_efficiency=0.6,
        tensor_sync_efficiency=0.4, unit_overlap=0.5,
        kernel_launch_overhead_s=6e-6, iteration_overhead_s=0.3e-6)


def configurations() -> list[tuple[str, AttentionProblem, Tiling]]:
    out = []
    for n in (1024, 2048, 4096):
        b = 16384 // n
        for d in (64, 128):
            square = AttentionProblem(batch=b, heads=16, seq_q=n, head_dim=d)
            for t in (Tiling(128, 64, 2, 8), Tiling(64, 64, 2, 4), Tiling(128, 32, 3, 4)):
                out.append(("fa2", square, t))
            out.append(("fa2", dataclasses.replace(square, causal=True), Tiling(128, 64, 2, 8)))
            backward = dataclasses.replace(square, pass_="bwd")
            for t in (Tiling(64, 64, 2, 4), Tiling(128, 64, 2, 8)):
                out.append(("fa2", backward, t))
        decode = AttentionProblem(batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=n,
                                  head_dim=128)
        for t in (Tiling(16, 64, 2, 4, 4), Tiling(16, 128, 2, 4, 8)):
            out.append(("decode", decode, t))
        out.append(("naive", AttentionProblem(batch=b // 4, heads=16, seq_q=n, head_dim=64),
                    Tiling(128, 64, 2, 8)))
    return out


def _time(task) -> float:
    schedule, problem, tiling, hw = task
    return predict(problem, tiling, schedule, hw)["time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--diff-step", type=float, nargs="+",
                        default=[calibrate.DIFF_STEP])
    args = parser.parse_args()
    base = load_hardware("h200-sxm")
    known = known_hardware(base)
    configs = configurations()
    times = map_tasks(_time, [(s, p, t, known) for s, p, t in configs], args.jobs)
    records = [record(s, p, t, m) for (s, p, t), m in zip(configs, times, strict=True)]
    params = calibrate.fitted_params(base)
    print(f"{len(records)} SYNTHETIC records; known parameters: "
          + ", ".join(f"{p.field}={getattr(known, p.field):.4g}" for p in params))
    for step in args.diff_step:
        calibrate.DIFF_STEP = step
        start = time.perf_counter()
        report = calibrate.fit(records, base, predict, jobs=args.jobs)
        wall = time.perf_counter() - start
        found = ", ".join(f"{p['field']}={p['fitted']:.4g}" for p in report["params"])
        print(f"diff step {step:g}: {report['evaluations']} evaluations, {wall:.0f} s "
              f"(--jobs {args.jobs}); train MAPE {report['train']['after']['mape_pct']:.2f}%, "
              f"held-out {report['held_out']['after']['mape_pct']:.2f}% "
              f"({report['message']})\n  found: {found}")


if __name__ == "__main__":
    main()
