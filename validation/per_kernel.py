"""Reconciliation per kernel: each kernel Nsight Compute profiled against the prediction's.

Where ncu profiled a record's kernels and they are the prediction's kernels (by name and
order), each kernel's predicted time without the launch overhead (the preset's
``kernel_launch_overhead_s``, which ncu's ``gpu__time_duration`` does not see) is set
against ncu's duration, and its DRAM bytes (as ncu profiles it where that differs:
``profiled``) against ncu's; beside them the SMs' clock it ran at and what it left dirty
in L2. Summaries over the records: what each kernel left dirty, the clocks, the signed
time error per kernel, head dim and tiling, and the launch gap (the measured time minus
the kernels' durations, per kernel).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from validation import stats

# What is compared per kernel.
KERNEL_METRICS = ("time", "dram")


def sum_or_none(*values):
    return None if any(v is None for v in values) else sum(values)


def dram_bytes(counts: dict):
    return sum_or_none(counts.get("dram_read"), counts.get("dram_write"))


def as_profiled(kernel: dict) -> dict:
    """A predicted kernel's time, DRAM bytes and what it left dirty as Nsight Compute
    profiles it: its ``profiled`` numbers where the prediction has them (a kernel that
    re-reads what an earlier one stored, simulated alone), else its own."""
    b = kernel.get("bytes", {})
    own = {"time_s": kernel.get("time_s"), "dram_read": b.get("dram_read"),
           "dram_write": b.get("dram_write"), "left_dirty": b.get("left_dirty")}
    return {**own, **(kernel.get("profiled") or {})}


def errors_pct(predicted: dict, measured: dict, metrics: tuple[str, ...]) -> dict:
    return {m: (stats.pct_errors([predicted[m]], [measured[m]])[0]
                if predicted[m] is not None and measured[m] else None) for m in metrics}


def kernel_rows(rec: dict, pred: dict, hw) -> list[dict]:
    """Each profiled kernel against the prediction's kernel of the same name and place;
    none if the record has no per-kernel counters or its kernels are not the prediction's.
    Each row also has the SMs' clock the kernel ran at (ncu, in records the runner made
    since 2026-12-06) beside the one the model gave it (``Hardware.at_tensor_clock`` for a
    kernel with matmuls)."""
    launch_s = hw.kernel_launch_overhead_s
    measured = (rec.get("counters") or {}).get("kernels") or []
    predicted = pred.get("kernels") or []
    if not measured or [k["name"] for k in measured] != [k.get("name") for k in predicted]:
        return []
    rows = []
    for m, p in zip(measured, predicted, strict=True):
        b, profiled = p.get("bytes", {}), as_profiled(p)
        time_s = profiled["time_s"]
        mine = {"time": None if time_s is None else time_s - launch_s,
                "dram": dram_bytes(profiled)}
        theirs = {"time": m.get("duration_s"),
                  "dram": sum_or_none(m.get("dram_read_bytes"), m.get("dram_write_bytes"))}
        matmul = bool((p.get("flops") or {}).get("tensor"))
        clock = {"measured": m.get("sm_clock_hz"), "matmul": matmul,
                 "model": (hw.at_tensor_clock() if matmul else hw).sm_clock_hz}
        stored, written = b.get("global_write"), m.get("dram_write_bytes")
        left = {"measured": None if stored is None or written is None else stored - written,
                "model": profiled["left_dirty"]}
        rows.append({"name": m["name"], "predicted": mine, "measured": theirs,
                     "error_pct": errors_pct(mine, theirs, KERNEL_METRICS), "sm_clock_hz": clock,
                     "left_dirty": left})
    return rows


def left_dirty_summary(rows: list[dict]) -> dict:
    """What each kernel left dirty in L2 at its end, measured and modelled, per kernel
    name: ``n``, ``measured`` and ``model`` (medians, bytes).

    Nsight Compute counts a kernel's DRAM writes within its range, and with
    ``--cache-control all`` what the kernel leaves dirty is written back by the next
    kernel's flush, outside it: the bytes the kernel stores (the model's count of them,
    exact) less ncu's DRAM writes are what it left dirty. The model's is what its L2 holds
    dirty at the kernel's end (``left_dirty``, counted in its DRAM writes). Medians: a
    kernel whose spills reach DRAM writes more than it stores."""
    found: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for r in rows:
        for k in r["kernels"]:
            left = k.get("left_dirty") or {}
            if left.get("measured") is not None and left.get("model") is not None:
                measured, model = found[k["name"]]
                measured.append(left["measured"])
                model.append(left["model"])
    return {name: {"n": len(measured), "measured": statistics.median(measured),
                   "model": statistics.median(model)}
            for name, (measured, model) in sorted(found.items())}


def clock_summary(rows: list[dict]) -> dict:
    """The SMs' clock the kernels ran at (ncu's GPC cycles per second), for the kernels with
    matmuls and the others, beside the clock the model gives them: per group n, median,
    min, max and the model's clocks (Hz; n 0 where the records do not say)."""
    groups = {"matmul": ([], set()), "other": ([], set())}
    for r in rows:
        for k in r["kernels"]:
            clock = k.get("sm_clock_hz") or {}
            if clock.get("measured"):
                values, model = groups["matmul" if clock["matmul"] else "other"]
                values.append(clock["measured"])
                model.add(clock["model"])
    return {name: {**stats.spread(values), "model": sorted(model)}
            for name, (values, model) in groups.items()}


def by_kernel_and_tiling(rows: list[dict]) -> list[dict]:
    """Each kernel's time errors (ncu duration against the predicted kernel time) per head
    dim and tiling, over the shapes: a mechanism the model leaves out shows as tilings of one
    kernel off by much the same signed error at every length, where the MAPE of a group
    averages it away. Sorted by kernel, head dim and tiling."""
    errors: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        t = r["tiling"]
        for k in r["kernels"]:
            if k["error_pct"]["time"] is not None:
                key = (k["name"], r["head_dim"], t["block_m"], t["block_n"], t["num_stages"],
                       t["num_warps"], t.get("split_kv", 1))
                errors[key].append(k["error_pct"]["time"])
    return [{"kernel": key[0], "head_dim": key[1],
             "tiling": dict(zip(("block_m", "block_n", "num_stages", "num_warps", "split_kv"),
                                key[2:], strict=True)),
             "n": len(e), "mean_error_pct": sum(e) / len(e), "min_error_pct": min(e),
             "max_error_pct": max(e)} for key, e in sorted(errors.items())]


def launch_gap_s(rec: dict) -> float | None:
    """(measured time - the ncu durations of its kernels) / kernels; None without them."""
    kernels = (rec.get("counters") or {}).get("kernels") or []
    durations = [k.get("duration_s") for k in kernels]
    if not durations or None in durations:
        return None
    return (rec["timing"]["median_s"] - sum(durations)) / len(durations)


def median_gap_per_group(rows: list[dict]) -> dict:
    """The median launch gap of each group's records: where kernels take milliseconds,
    timing noise swamps a gap of microseconds; decode's short calls show it (and what
    ``do_bench``'s flush may add to them: ``validation/overheads.py``)."""
    gaps = defaultdict(list)
    for r in rows:
        if r["launch_gap_s"] is not None:
            gaps[r["group"]].append(r["launch_gap_s"])
    return {g: statistics.median(v) for g, v in sorted(gaps.items())}
