"""Counts replayed from a trace file: every record summed, nothing taken from formulas."""

from __future__ import annotations

from simulator.counting import KernelCount
from simulator.hardware import Hardware
from simulator.prediction import assemble_prediction
from traces.trace import Trace, record_counts


def trace_counts(trace: Trace) -> list[KernelCount]:
    names = trace.tensor_names
    counts = []
    for k in trace.kernels:
        totals = record_counts(k.records, len(names))
        count = KernelCount(k.name, k.grid)
        for i, name in enumerate(names):
            if totals["reads"][i]:
                count.read(name, int(totals["reads"][i]))
            if totals["writes"][i]:
                count.write(name, int(totals["writes"][i]))
        count.work(totals["tensor_flops"], totals["exp_ops"], totals["other_flops"])
        counts.append(count)
    return counts


def replay_prediction(trace: Trace, hw: Hardware) -> dict:
    return assemble_prediction(trace.problem, trace.tiling, trace.schedule, hw,
                               trace_counts(trace))
