"""Speed of the foundation: `tilesim count` end to end, trace generation, replay, export.

Run from the repository root:  python benchmarks/foundation.py
Prints a Markdown table for BENCHMARKS.md. Targets (issue 2): count <= 1 s end to end;
trace generation >= 20 M records/s and replay >= 50 M records/s for B=1 H=32 N=32768
d=128 fa2 forward; Ramulator export >= 2 M lines/s with flat memory.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traces import export  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.schedules import build_schedule  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from traces.trace import Trace, iter_kernel_traces, record_counts  # noqa: E402


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def count_end_to_end(argv: list[str], repeats: int = 5) -> float:
    cmd = [sys.executable, "-m", "simulator", "count", *argv, "--json"]
    return median_time(lambda: subprocess.run(cmd, cwd=REPO, check=True,
                                              stdout=subprocess.DEVNULL), repeats)


def main() -> None:
    rows = []
    for argv in (["--seq", "4096"], ["--seq", "131072", "--causal"],
                 ["--schedule", "naive", "--seq", "16384", "--pass", "fwd+bwd"],
                 ["--schedule", "decode", "--seq", "1", "--kv-seq", "131072", "--split-kv", "16",
                  "--kv-heads", "8"]):
        rows.append((f"`tilesim count {' '.join(argv)}` (process start to exit)",
                     f"{count_end_to_end(argv):.2f} s", "<= 1 s"))

    problem = AttentionProblem(batch=1, heads=32, seq_q=32768, head_dim=128)
    tiling = Tiling(128, 64)
    Trace.build(AttentionProblem(1, 1, 256, 128), tiling, "fa2")  # compile numba once
    trace = None

    def build():
        nonlocal trace
        trace = None
        trace = Trace.build(problem, tiling, "fa2")

    gen = median_time(build, 3)
    n = trace.n_records
    rows.append((f"trace generation, fa2 fwd B=1 H=32 N=32768 d=128 ({n / 1e6:.1f} M records)",
                 f"{n / gen / 1e6:.1f} M records/s ({gen:.2f} s)", ">= 20 M/s"))
    records, n_tensors = trace.kernels[0].records, len(trace.tensors)
    rep = median_time(lambda: record_counts(records, n_tensors), 5)
    rows.append(("replay counting (same trace)", f"{n / rep / 1e6:.1f} M records/s ({rep:.2f} s)",
                 ">= 50 M/s"))
    trace = records = None  # free ~1 GB before the export measurement

    small = build_schedule(AttentionProblem(batch=1, heads=4, seq_q=8192, head_dim=128),
                           tiling, "fa2")
    width = export.address_width(small.device_bytes)
    kernels = list(iter_kernel_traces(small))
    with open(os.devnull, "wb") as sink:
        tracemalloc.start()
        start = time.perf_counter()
        lines = export.write_ramulator2((k.records for k in kernels), sink, width)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    file_mb = lines * (6 + width) / 1e6
    rows.append((f"Ramulator 2 export, fa2 fwd B=1 H=4 N=8192 ({lines / 1e6:.1f} M lines, "
                 f"{file_mb:,.0f} MB of text)",
                 f"{lines / elapsed / 1e6:.1f} M lines/s, peak extra memory {peak / 1e6:.0f} MB",
                 ">= 2 M/s, flat"))

    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print()
    print("| measurement | result | target |")
    print("| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
