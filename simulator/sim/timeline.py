"""A simulation as a Chrome Trace Event file (opens in Perfetto UI and chrome://tracing).

Tracks (process "GPU"):

- ``kernels``: one slice per kernel launch (launch overhead included);
- ``SM nnn slot k``: one track per CTA slot of each SM (an SM runs up to ``ctas_per_sm`` CTAs
  at once, and slices on one track must not overlap), one slice per CTA;
- counters ``HBM GB/s`` and ``L2 GB/s`` (bandwidth delivered, averaged over at most
  ``COUNTER_POINTS`` intervals) and ``SRAM in use`` (KiB of shared memory held by resident
  CTAs, summed over SMs).

Size is bounded for huge runs: at most ``MAX_CTA_SLICES`` CTA slices are written — when a
run has more, only the first SMs' slots keep their slices (all CTAs of those SMs) and the
file says so in ``otherData.note``; counters are averaged, never one point per event.
Timestamps are microseconds, as the format wants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from simulator.sim import Simulation

MAX_CTA_SLICES = 100_000
COUNTER_POINTS = 2000
_PID = 1
_KERNEL_TID = 0
_SLOTS_PER_SM = 64  # tid of (sm, k) = 1 + sm * _SLOTS_PER_SM + k


def _averaged(segments: list[np.ndarray], edges: np.ndarray) -> np.ndarray:
    """Mean rate over each interval of ``edges`` from ``(start, end, rate)`` rows.

    The rates' integral is piecewise linear between the rows' starts and ends: build it
    there, interpolate it at the edges, and difference.
    """
    rows = np.vstack(segments) if segments else np.zeros((0, 3))
    rows = rows[rows[:, 1] > rows[:, 0]]
    if rows.shape[0] == 0:
        return np.zeros(edges.size - 1)
    times = np.concatenate([rows[:, 0], rows[:, 1]])
    change = np.concatenate([rows[:, 2], -rows[:, 2]])
    order = np.argsort(times, kind="stable")
    times, rate = times[order], np.cumsum(change[order])
    integral = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(times))])
    amount = np.interp(edges, times, integral)
    return np.diff(amount) / np.diff(edges)


def _counter(name: str, times: np.ndarray, values: np.ndarray, unit: str) -> list[dict]:
    return [{"ph": "C", "name": name, "pid": _PID, "ts": float(t) * 1e6,
             "args": {unit: round(float(v), 3)}} for t, v in zip(times, values, strict=True)]


def chrome_trace(sim: Simulation) -> dict:
    sm_count = sim.hardware.sm_count
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": "GPU"}},
        {"ph": "M", "name": "thread_name", "pid": _PID, "tid": _KERNEL_TID,
         "args": {"name": "kernels"}},
    ]
    total = sum(r.cta_start.size for r in sim.runs)
    per_sm = max(total / sm_count, 1.0)
    kept_sms = sm_count if total <= MAX_CTA_SLICES else max(1, int(MAX_CTA_SLICES // per_sm))
    named: set[int] = set()
    for run in sim.runs:
        events.append({"ph": "X", "name": run.name, "cat": "kernel", "pid": _PID,
                       "tid": _KERNEL_TID, "ts": run.launch_s * 1e6,
                       "dur": (run.end_s - run.launch_s) * 1e6,
                       "args": {"grid": int(run.cta_start.size), "ctas_per_sm": run.ctas_per_sm}})
        sms = run.cta_slot % sm_count
        keep = np.flatnonzero(sms < kept_sms)
        tids = 1 + sms * _SLOTS_PER_SM + run.cta_slot // sm_count
        for c in keep:
            tid = int(tids[c])
            if tid not in named:
                named.add(tid)
                events.append({"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid,
                               "args": {"name": f"SM {sms[c]:03d} slot "
                                                f"{run.cta_slot[c] // sm_count}"}})
            events.append({"ph": "X", "name": f"{run.name} {c}", "cat": "cta", "pid": _PID,
                           "tid": tid, "ts": float(run.cta_start[c]) * 1e6,
                           "dur": float(run.cta_end[c] - run.cta_start[c]) * 1e6,
                           "args": {"kernel": run.name, "cta": int(c)}})
    end = max((r.end_s for r in sim.runs), default=0.0)
    edges = np.linspace(0.0, end, COUNTER_POINTS + 1) if end > 0 else np.zeros(2)
    hbm = _averaged([r.hbm_segments for r in sim.runs], edges)
    l2 = _averaged([r.l2_segments for r in sim.runs], edges)
    events += _counter("HBM GB/s", edges[:-1], hbm / 1e9, "GB/s")
    events += _counter("L2 GB/s", edges[:-1], l2 / 1e9, "GB/s")
    sram = _averaged([np.column_stack([r.cta_start, r.cta_end,
                                       np.full(r.cta_start.size, r.sram_bytes_per_cta)])
                      for r in sim.runs], edges)
    events += _counter("SRAM in use", edges[:-1], sram / 1024, "KiB")
    note = (f"CTA slices of all {sm_count} SMs" if kept_sms >= sm_count else
            f"{total} CTAs: slices kept for SMs 0..{kept_sms - 1} of {sm_count} only "
            f"(cap {MAX_CTA_SLICES}); counters cover the whole GPU")
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "tilesim", "schedule": sim.schedule,
                          "hardware": sim.hardware.name, "mode": sim.mode, "note": note}}


def write_chrome_trace(sim: Simulation, path: str | Path) -> None:
    """Write the trace atomically (no partial file on failure)."""
    from simulator.cli.common import write_atomically

    trace = chrome_trace(sim)

    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            json.dump(trace, f, separators=(",", ":"))

    write_atomically(path, write)
