"""Reading a file of the overheads probe (``validation.overheads``) and what it answers.

``summary``: per call, the median time under each mode and the differences that answer
the probe's questions; ``format_table`` prints them; ``compare`` sets the CTAs-per-SM
sweep measured on a GPU against the model (``validation.ctas_per_sm``).
"""

from __future__ import annotations

import json
import sys

from validation import ctas_per_sm
from validation.overheads import MODES, SCHEMA


def load(path: str) -> list[dict]:
    """The rows of a probe file; a malformed line is a ``ValueError`` naming it."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or row.get("schema") != SCHEMA:
                raise ValueError(f"{path}:{number}: not a {SCHEMA} row")
            rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per call, the median time under each mode and the differences that answer the
    module's questions, in microseconds: ``writeback_us`` (dirty - clean), ``flush_us``
    (clean - warm: what a clean flush still costs, the call's own misses) and
    ``do_bench_vs_dirty_us`` (should be about 0: this loop flushes as do_bench does),
    ``do_bench_vs_ncu_us`` (do_bench less the kernels' flushed ncu durations: the records'
    launch gap, for the calls ncu profiles).
    A call's ``launch_gap_us`` (``empty_x2 - empty``, warm) is reported once, on
    ``empty_x2``; a pointer chase or a matmul chain gets ``per_step_ns`` per mode (its
    time over its steps: one load's or one matmul's latency each, the launch included but
    spread over thousands of steps); a call
    timed also kernel by kernel (``X_split``, ``X_reduce``) gets
    ``between_us`` per mode: the whole call's time less its kernels' alone; a call of the
    CTAs-per-SM sweep gets ``per_iteration`` (``ctas_per_sm.per_iteration``). Calls with an
    error carry it instead."""
    by_call: dict[str, dict] = {}
    steps = {row["call"]: (row.get("detail") or {}).get("steps") for row in rows}
    swept = {row["call"]: row["detail"]["sweep"] for row in rows
             if "sweep" in (row.get("detail") or {})}
    for row in rows:
        entry = by_call.setdefault(row["call"], {"call": row["call"], "median_us": {}})
        if row.get("error"):
            entry["error"] = row["error"]
        elif row.get("mode") in MODES:
            entry["median_us"][row["mode"]] = row["median_s"] * 1e6

    def diff(medians: dict, a: str, b: str) -> float | None:
        return medians[a] - medians[b] if a in medians and b in medians else None

    for entry in by_call.values():
        m = entry["median_us"]
        entry["writeback_us"] = diff(m, "dirty", "clean")
        entry["flush_us"] = diff(m, "clean", "warm")
        entry["do_bench_vs_dirty_us"] = diff(m, "do_bench", "dirty")
        entry["do_bench_vs_ncu_us"] = diff(m, "do_bench", "ncu_flushed")
        if steps.get(entry["call"]):
            entry["per_step_ns"] = {mode: v * 1e3 / steps[entry["call"]]
                                    for mode, v in m.items()}
        if entry["call"] in swept:
            entry["per_iteration"] = ctas_per_sm.per_iteration(m, swept[entry["call"]])
    for name, entry in by_call.items():
        parts = [by_call.get(f"{name}_{part}", {}).get("median_us", {})
                 for part in ("split", "reduce")]
        if all(parts):
            whole = entry["median_us"]
            entry["between_us"] = {mode: whole[mode] - parts[0][mode] - parts[1][mode]
                                   for mode in MODES
                                   if mode in whole and all(mode in p for p in parts)}
    one = by_call.get("empty", {}).get("median_us", {})
    two = by_call.get("empty_x2", {}).get("median_us", {})
    if "warm" in one and "warm" in two:
        by_call["empty_x2"]["launch_gap_us"] = two["warm"] - one["warm"]
    return list(by_call.values())


def format_table(entries: list[dict]) -> str:
    def us(v):
        return f"{'-':>11s}" if v is None else f"{v:11.1f}"
    extra = ("wb", "flush", "db-dirty", "db-ncu")
    lines = [f"{'call':28s} " + " ".join(f"{m:>11s}" for m in MODES + extra),
             "(us; wb = dirty - clean, flush = clean - warm, db-X = do_bench - X)"]
    for e in entries:
        if e.get("error"):
            lines.append(f"{e['call']:28s} failed: {e['error']}")
            continue
        m = e["median_us"]
        values = [m.get(mode) for mode in MODES] + [
            e["writeback_us"], e["flush_us"], e["do_bench_vs_dirty_us"], e["do_bench_vs_ncu_us"]]
        lines.append(f"{e['call']:28s} " + " ".join(us(v) for v in values))
        if e.get("between_us"):
            lines.append(f"{'':28s} whole - split - reduce: " + ", ".join(
                f"{mode} {v:.1f}" for mode, v in e["between_us"].items()) + " us")
        if e.get("per_step_ns"):
            what = ("per matmul (a chain's step)" if e["call"].startswith("mma_chain")
                    else "per load (a chase's step)")
            lines.append(f"{'':28s} {what}: " + ", ".join(
                f"{mode} {v:.0f} ns" for mode, v in e["per_step_ns"].items()))
        if e.get("per_iteration"):
            it = e["per_iteration"]
            lines.append(f"{'':28s} a CTA's iteration {it['per_cta_ns']:.0f} ns, the SM's "
                         f"{it['per_sm_ns']:.0f} ns (warm)")
        if "launch_gap_us" in e:
            lines.append(f"{'':28s} launch gap (empty_x2 - empty, warm): "
                         f"{e['launch_gap_us']:.2f} us")
    return "\n".join(lines)


def compare(args) -> int:
    """``compare``: print ``ctas_per_sm.compare`` of the probe file's swept calls measured
    on a GPU, or without a file the model's predictions of every swept call."""
    from simulator.hardware import load_hardware
    from validation.records import read_records

    records, bad = read_records(args.records)
    if bad:
        print(f"python -m validation.overheads: {len(bad)} malformed record line(s) in "
              f"{args.records} skipped (first: {bad[0]})", file=sys.stderr)
    hw = load_hardware(args.hardware)
    if args.path is None:
        table = ctas_per_sm.compare({}, records, hw)
    else:
        rows = [r for r in load(args.path) if r.get("dry_run") is False]
        details = {r["call"]: r["detail"]["sweep"] for r in rows
                   if "sweep" in (r.get("detail") or {})}
        measured = {e["call"]: e["per_iteration"]["per_cta_ns"] for e in summary(rows)
                    if (e.get("per_iteration") or {}).get("per_cta_ns") is not None}
        table = ctas_per_sm.compare(measured, records, hw,
                                    {n: d for n, d in details.items() if n in measured})
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    if not table:
        print("no swept calls measured on a GPU in this file")
        return 0

    def ns(v):
        return f"{'-':>10s}" if v is None else f"{v:10.0f}"
    print(f"{'call':44s} {'c':>2s} {'measured':>10s} {'predicted':>10s} {'error':>7s}"
          f"   (ns per CTA iteration, warm; {hw.name})")
    for t in table:
        error = "-" if t["error_pct"] is None else f"{t['error_pct']:+6.1f}%"
        print(f"{t['call']:44s} {t['ctas_per_sm']:2d} {ns(t['measured_per_cta_ns'])} "
              f"{ns(t['predicted_per_cta_ns'])} {error:>7s}")
    return 0
