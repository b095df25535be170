"""Counts replayed from a trace file: every record summed, nothing taken from formulas."""

from __future__ import annotations

from simulator.counting import KernelCount
from simulator.hardware import Hardware
from simulator.prediction import assemble_prediction
from traces.problem import ProblemError
from traces.schedules import build_schedule
from traces.schedules.base import Tensor
from traces.trace import Trace, TraceError, record_counts


def _tensor_text(t: Tensor | None) -> str:
    if t is None:
        return "absent"
    return f"{t.name} [{t.planes}, {t.rows}, {t.cols}] x {t.elem_bytes} B at {t.base:#x}"


def check_schedule(trace: Trace) -> None:
    """``TraceError`` unless the trace's tensors and kernels are those its problem, tiling and
    schedule give.

    Replay names the records' tensors and kernels after the metadata's lists, and the
    prediction takes SRAM and residency from the schedule rebuilt from the problem; the two
    must be the same. Files with a metadata hash cannot disagree unless altered with the
    hash recomputed; for files written before it, this catches an edited problem.
    """
    try:
        sched = build_schedule(trace.problem, trace.tiling, trace.schedule)
    except ProblemError as exc:
        raise TraceError(f"its problem, tiling and schedule are not valid together: {exc}") \
            from None
    mine, theirs = list(trace.tensors.values()), list(sched.tensors.values())
    for i in range(max(len(mine), len(theirs))):
        got = mine[i] if i < len(mine) else None
        want = theirs[i] if i < len(theirs) else None
        if got != want:
            raise TraceError(f"tensor {i} is {_tensor_text(got)} in the file but "
                             f"{_tensor_text(want)} for its problem, tiling and schedule")
    got_k = [f"{k.name} x{k.grid}" for k in trace.kernels]
    want_k = [f"{k.name} x{k.grid}" for k in sched.kernels]
    if got_k != want_k:
        raise TraceError(f"kernels are {', '.join(got_k) or 'none'} in the file but "
                         f"{', '.join(want_k)} for its problem, tiling and schedule")


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


def replay_prediction(trace: Trace, hw: Hardware, compiled=None) -> dict:
    """The prediction of ``tilesim count`` with the trace's counts; ``compiled`` as
    ``count_prediction`` takes it (registers and shared memory by kernel name, for
    residency), None to estimate them."""
    check_schedule(trace)
    return assemble_prediction(trace.problem, trace.tiling, trace.schedule, hw,
                               trace_counts(trace), compiled)
