"""The report's charts as inline SVG: roofline, bytes and time bars, sweep heatmap, timeline,
bill curves, ledger row and predicted-vs-measured scatter.

Each function takes the JSON-ready dict of one section and returns an ``<svg>`` string; marks
carry exact numbers in ``data-tip`` for the page's tooltips.
"""

from __future__ import annotations

import math

from simulator.cli import render
from simulator.explain.svgplot import Chart, attr, color_scale, log_bounds, si

NAIVE, FA2, ACCENT, GREY = "#c0392b", "#1f6fb2", "#e67e22", "#7f8c8d"
SCHEDULE_COLORS = {"naive": NAIVE, "fa2": FA2, "fa1": "#8e44ad", "decode": "#16a085"}
SHAPES = ("circle", "square", "diamond", "triangle")
# Timeline: two tones per kernel, alternating between consecutive CTAs of one SM slot.
KERNEL_TONES = [("#1f6fb2", "#5a9bd4"), ("#e67e22", "#f0a866"), ("#27ae60", "#6fcf97"),
                ("#8e44ad", "#b07cc6"), ("#c0392b", "#e17b6f")]
MAX_TIMELINE_RECTS = 12_000  # beyond this, consecutive CTAs of a slot are drawn as one bar


def fmt_time(s: float | None) -> str:
    """The CLI's time format with the page's "µs" and one decimal below a millisecond."""
    return render.fmt_time(s, micro="µs", micro_digits=1)


def fmt_bytes(n: float | None) -> str:
    return "-" if n is None else si(n, "B")


def roofline_chart(r: dict) -> str:
    c = r["ceilings"]
    peak, bw = c["tensor_flops_per_s"], c["hbm_bytes_per_s"]
    placed = [k for k in r["kernels"] if k["intensity"]]
    ridge = c["ridge_points"]["tensor"]
    xlo, xhi = log_bounds([k["intensity"] for k in placed] + [ridge], 4)
    xhi = max(xhi, ridge * 8)  # room right of the ridge for its label
    tops = [peak, c["exp_ceiling_flops_per_s"], c["fp32_flops_per_s"]]
    ylo = min([xlo * bw] + [k["attainable_flops_per_s"] for k in placed]) / 2
    chart = Chart(640, 440, margin=(34, 20, 52, 64),
                  title=f"{r['hardware']['display_name']}, {r['dtype']}")
    chart.scales((xlo, xhi), (ylo, max(tops) * 2), xlog=True, ylog=True)
    chart.axes("arithmetic intensity (FLOPs per DRAM byte)", "attainable FLOP/s",
               xfmt=lambda v: si(v), yfmt=lambda v: si(v))
    for top, b, dash, color, name in (
        (peak, bw, "", "#1d2733", "datasheet"),
        (c["tensor_achievable_flops_per_s"], c["hbm_achievable_bytes_per_s"], "6 4", "#6b7785",
         "achievable"),
    ):
        knee = top / b
        xs = [xlo, knee, xhi] if xlo < knee < xhi else [xlo, xhi]
        ys = [min(top, x * b) for x in xs]
        chart.line(xs, ys, color, 2.4 if not dash else 1.5, dash,
                   tip=f"{name} roofline: min({si(top, 'FLOP/s')}, I × {si(b, 'B/s')})\n"
                       f"ridge {knee:.1f} FLOP/B")
    chart.line([xlo, xhi], [c["exp_ceiling_flops_per_s"]] * 2, ACCENT, 1.8, "2 3",
               tip=f"exp unit: {si(c['exp_ops_per_s'], 'exp/s')} × {c['flops_per_exp']:.0f} "
                   f"FLOP/exp = {si(c['exp_ceiling_flops_per_s'], 'FLOP/s')}")
    chart.line([xlo, xhi], [c["fp32_flops_per_s"]] * 2, GREY, 1.3, "8 3 2 3",
               tip=f"fp32 ALUs: {si(c['fp32_flops_per_s'], 'FLOP/s')}")
    chart.line([ridge, ridge], [ylo, peak], "#9aa5b1", 1, "3 3")
    chart.text(ridge, ylo, f"ridge {ridge:.0f} FLOP/B", anchor="middle", dy=-24)
    chart.text(ridge, ylo, "← memory-bound   compute-bound →", anchor="middle", dy=-9)
    # Numbered as in the report's kernel table (1-based over every kernel).
    numbered = [(n, k) for n, k in enumerate(r["kernels"], start=1) if k["intensity"]]
    for n, k in numbered:
        tip = (f"#{n} {k['name']} ({k['schedule']})\nintensity {k['intensity']:.2f} FLOP/B\n"
               f"attainable {si(k['attainable_flops_per_s'], 'FLOP/s')} — {k['bound']}-bound\n"
               f"tensor utilisation {k['tensor_utilisation']:.1%} of peak\n"
               f"FLOPs {si(k['flops'])}, DRAM {fmt_bytes(k['dram_bytes'])}\n"
               f"model time {fmt_time(k['model_time_s'])}")
        chart.point(k["intensity"], k["attainable_flops_per_s"],
                    SCHEDULE_COLORS.get(k["schedule"], GREY),
                    "square" if k["schedule"] == "naive" else "circle", 6, tip)
    points = [(chart.x(k["intensity"]), chart.y(k["attainable_flops_per_s"])) for k in placed]
    taken = [(x - 7, y - 7, x + 7, y + 7) for x, y in points]
    for (n, _), (px, py) in zip(numbered, points, strict=True):
        dx, dy = place_label(px, py, 7.5 * len(str(n)), 12, taken)
        chart.front.append(f'<text class="pt-label" x="{px + dx:.1f}" y="{py + dy:.1f}">'
                           f"{n}</text>")
    chart.legend([("roofline (datasheet)", "#1d2733", "line"),
                  ("achievable (preset efficiencies)", "#6b7785", "dash"),
                  (f"exp unit × {c['flops_per_exp']:.0f} FLOP/exp", ACCENT, "dot"),
                  ("fp32 ALUs", GREY, "dashdot"),
                  ("naive kernels (# in the table)", NAIVE, "square"),
                  ("FA2 kernels", FA2, "circle")],
                 x=chart.x0 + 10, y=chart.y1 + 28, width=225)
    return chart.svg("chart-roofline")


def place_label(px: float, py: float, w: float, h: float,
                taken: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    """An offset for a ``w x h`` label near (px, py) that overlaps no box in ``taken``.

    Tries the four corners, then further out; the chosen box is added to ``taken``.
    """
    offsets = [(8, -7), (8, 15), (-8 - w, -7), (-8 - w, 15), (-w / 2, -12), (-w / 2, 22),
               (20, -7), (-20 - w, -7), (8, -19), (8, 27), (-8 - w, -19), (-8 - w, 27)]
    for dx, dy in offsets:
        box = (px + dx, py + dy - h + 2, px + dx + w, py + dy + 2)
        if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                   for b in taken):
            break
    taken.append(box)
    return dx, dy


def bytes_chart(compare: dict) -> str:
    """Grouped horizontal bars, log scale: bytes per level for naive and FA2."""
    levels = [("global read", "bytes", "global_read"), ("global write", "bytes", "global_write"),
              ("DRAM read", "bytes", "dram_read"), ("DRAM write", "bytes", "dram_write"),
              ("SRAM read", "bytes", "smem_read"), ("HBM footprint", None, "hbm_footprint_bytes")]
    rows = []
    for label, group, key in levels:
        rows.append((label, [(name, compare[name][group][key] if group else compare[name][key])
                             for name in ("naive", "fa2")]))
    values = [v for _, pairs in rows for _, v in pairs if v]
    lo, hi = log_bounds(values, 3)
    chart = Chart(540, 330, margin=(30, 20, 48, 108), title="bytes per level")
    chart.scales((lo, hi), (0, len(rows)), xlog=True)
    chart.axes("bytes (log scale)", "", xfmt=lambda v: si(v, "B"), yticks=[], grid=True)
    for i, (label, pairs) in enumerate(rows):
        chart.text(lo, len(rows) - i - 0.5, label, cls="tick", anchor="end", dx=-6, dy=4)
        for j, (name, v) in enumerate(pairs):
            if not v:
                continue
            y = len(rows) - i - 0.12 - j * 0.38
            chart.rect(lo, y, v, y - 0.34, SCHEDULE_COLORS[name],
                       tip=f"{name}: {label} {fmt_bytes(v)} ({v:,} B)")
    chart.legend([("naive", NAIVE, "square"), ("FA2", FA2, "square")], width=90)
    return chart.svg("chart-bytes")


def time_chart(compare: dict) -> str:
    """One stacked bar per schedule, a segment per kernel (launch overhead included); a
    schedule that was not timed (it does not fit in HBM) is labelled instead."""
    names = ("naive", "fa2")
    total = max(compare[n]["time_s"] or 0.0 for n in names)
    chart = Chart(540, 210, margin=(30, 34, 48, 108), title="time per kernel")
    chart.scales((0, total * 1.22), (0, len(names)))
    chart.axes("time", "", xfmt=lambda v: si(v, "s"), yticks=[])
    for i, name in enumerate(names):
        y, start = len(names) - i - 0.2, 0.0
        chart.text(0, y - 0.3, "naive" if name == "naive" else "FA2", cls="tick", anchor="end",
                   dx=-6, dy=4)
        if compare[name]["time_s"] is None:
            chart.text(0, y - 0.3, "does not fit in HBM: not timed", dx=6, dy=4)
            continue
        for j, k in enumerate(compare[name]["kernels"]):
            shade = SCHEDULE_COLORS[name] if j % 2 == 0 else ("#e17b6f" if name == "naive"
                                                              else "#6aa6d8")
            chart.rect(start, y, start + k["time_s"], y - 0.6, shade,
                       tip=f"{k['name']}: {fmt_time(k['time_s'])} ({k['bound']}-bound)\n"
                           f"DRAM {fmt_bytes(k['dram_bytes'])}")
            start += k["time_s"]
        chart.text(start, y - 0.3, fmt_time(start), dx=6, dy=4)
    return chart.svg("chart-time")


def heatmap_chart(sweep: dict) -> str:
    """Predicted time over block_m (rows) x block_n (columns); best cell outlined."""
    bms, bns = sweep["block_m"], sweep["block_n"]
    cells = {(c["block_m"], c["block_n"]): c for c in sweep["cells"]}
    times = [c["time_s"] for c in sweep["cells"] if c["legal"]]
    best = sweep["best"]
    lo, hi = (min(times), max(times)) if times else (1.0, 1.0)
    span = math.log(hi / lo) if hi > lo else 1.0
    cw, ch = 96, 62
    chart = Chart(110 + cw * len(bns) + 150, 90 + ch * len(bms),
                  margin=(34, 150, 52, 110), title=f"{sweep['schedule']}: simulated time")
    chart.scales((0, len(bns)), (0, len(bms)))
    chart.axes("block_n", "block_m", yticks=[], xticks=[], grid=False)
    for j, bn in enumerate(bns):
        chart.text(j + 0.5, 0, str(bn), cls="tick", anchor="middle", dy=16)
    for i, bm in enumerate(bms):
        y = len(bms) - i
        chart.text(0, y - 0.5, str(bm), cls="tick", anchor="end", dx=-8, dy=4)
        for j, bn in enumerate(bns):
            c = cells[(bm, bn)]
            if c["legal"]:
                t = math.log(c["time_s"] / lo) / span
                tip = (f"block_m {bm}, block_n {bn}\ntime {fmt_time(c['time_s'])} "
                       f"({c['time_s'] / lo:.2f}× best)\nDRAM {fmt_bytes(c['dram_bytes'])}\n"
                       f"SRAM/CTA {fmt_bytes(c['sram_bytes_per_cta'])}, "
                       f"{c['ctas_per_sm']} CTA/SM, {c['bound']}-bound")
                chart.rect(j + 0.02, y - 0.02, j + 0.98, y - 0.98, color_scale(t), tip=tip,
                           cls="cell")
                chart.text(j + 0.5, y - 0.5, fmt_time(c["time_s"]), cls="cell-text",
                           anchor="middle", dy=4, front=False,
                           fill="#1d2733" if t > 0.6 else "#fff")  # dark text on light cells
            else:
                chart.rect(j + 0.02, y - 0.02, j + 0.98, y - 0.98, "#e3e6ea",
                           tip=f"block_m {bm}, block_n {bn}: refused — {c['reason']}")
                chart.text(j + 0.5, y - 0.5, "does not fit", cls="tick", anchor="middle",
                           dy=4, front=False)
            if best and (bm, bn) == (best["block_m"], best["block_n"]):
                chart.marks.append(
                    f'<rect class="best" x="{chart.x(j + 0.06):.1f}" '
                    f'y="{chart.y(y - 0.06):.1f}" width="{chart.x(0.88) - chart.x(0):.1f}" '
                    f'height="{chart.y(0) - chart.y(0.88):.1f}" rx="3"/>')
    bar_x = chart.x1 + 30
    for k in range(40):  # colour bar: fast (dark) at the bottom, slow (light) at the top
        y = chart.y0 - (k + 1) * (chart.y0 - chart.y1) / 40
        chart.front.append(f'<rect x="{bar_x}" y="{y:.1f}" width="16" '
                           f'height="{(chart.y0 - chart.y1) / 40 + 0.5:.1f}" '
                           f'fill="{color_scale((k + 0.5) / 40)}"/>')
    chart.front.append(f'<text class="tick" x="{bar_x + 22}" y="{chart.y0:.1f}">'
                       f'{attr(fmt_time(lo))} (best)</text>')
    chart.front.append(f'<text class="tick" x="{bar_x + 22}" y="{chart.y1 + 10:.1f}">'
                       f'{attr(fmt_time(hi))}</text>')
    return chart.svg("chart-heatmap", "zoom-xy")


def timeline_chart(tl: dict) -> str:
    """A Gantt of CTAs on SM tracks (one row per SM, a sub-lane per resident slot)."""
    sm_count = tl["sm_count"]
    row = 4.4 if sm_count > 80 else 7.0
    height = int(sm_count * row) + 96
    chart = Chart(1080, height, margin=(34, 20, 48, 70),
                  title=f"{tl['schedule']} timeline, {_tiling_text(tl['tiling'])}")
    total = tl["time_s"]
    chart.scales((0, total), (0, sm_count))
    chart.axes("time", "SM", xticks=[], yticks=[], grid=False)
    n_rects = sum(len(s["sm"]) for s in tl["slices"])
    group = max(1, math.ceil(n_rects / MAX_TIMELINE_RECTS))
    bars = []
    for s in tl["slices"]:
        k = tl["kernels"][s["kernel"]]
        per_sm = max(k["ctas_per_sm"], 1)
        tones = KERNEL_TONES[s["kernel"] % len(KERNEL_TONES)]
        by_slot: dict = {}
        for i, (sm, lane) in enumerate(zip(s["sm"], s["lane"], strict=True)):
            by_slot.setdefault((sm, lane), []).append(i)
        for (sm, lane), idx in by_slot.items():
            for g in range(0, len(idx), group):
                first, last = idx[g], idx[min(g + group, len(idx)) - 1]
                t0 = s["start_s"][first]
                t1 = s["start_s"][last] + s["dur_s"][last]
                y_top = chart.y(sm_count - sm - lane / per_sm)
                h = row / per_sm
                ctas = f"CTA {first}" if first == last else f"CTAs {first}–{last}"
                tip = (f"{k['name']}: {ctas}\nSM {sm}, slot {lane}\nstart {fmt_time(t0)}, "
                       f"duration {fmt_time(t1 - t0)}")
                bars.append(f'<rect x="{chart.x(t0):.2f}" y="{y_top:.2f}" '
                            f'width="{max(chart.x(t1) - chart.x(t0), 0.25):.2f}" '
                            f'height="{max(h - 0.25, 0.4):.2f}" fill="{tones[(g // group) % 2]}" '
                            f'data-tip="{attr(tip)}"/>')
        x_start = chart.x(k["start_s"])
        bars.append(f'<line x1="{x_start:.1f}" x2="{x_start:.1f}" y1="{chart.y1}" '
                    f'y2="{chart.y0}" stroke="#33404f" stroke-width="0.6" '
                    f'stroke-dasharray="3 3" vector-effect="non-scaling-stroke"/>')
    for sm in range(0, sm_count, 16 if sm_count > 64 else 8):
        chart.text(0, sm_count - sm - 0.5, f"SM {sm}", cls="lane-label", anchor="end", dx=-6,
                   dy=3)
    chart.marks.append(f'<g class="zoom-layer">{"".join(bars)}</g>')
    ticks = []
    for v in chart.x.ticks(7):
        px = chart.x(v)
        ticks.append(f'<line class="grid" x1="{px:.1f}" x2="{px:.1f}" y1="{chart.y1}" '
                     f'y2="{chart.y0}"/><text class="tick" x="{px:.1f}" y="{chart.y0 + 16}" '
                     f'text-anchor="middle">{attr(fmt_time(v))}</text>')
    chart.back.append(f'<g class="zoom-ticks">{"".join(ticks)}</g>')
    attrs = {"data-d0": 0, "data-d1": repr(total), "data-p0": chart.x0, "data-p1": chart.x1,
             "data-ytop": chart.y1, "data-ybot": chart.y0}
    return chart.svg("chart-timeline", "zoom-x", attrs)


def _tiling_text(t: dict) -> str:
    return (f"BM={t['block_m']} BN={t['block_n']} stages={t['num_stages']} "
            f"warps={t['num_warps']}")


def bill_chart(bill: dict, mark_seq: int | None = None) -> str:
    rows = sorted(bill["rows"], key=lambda r: r["seq"])
    curves = [("S bill 2·N²·s", "s_bytes", NAIVE, ""), ("S+P total 4·N²·s", "sp_bytes", ACCENT, ""),
              ("Q,K,V,O 4·N·d·s", "qkvo_bytes", FA2, ""), ("FLOPs 4·N²·d", "flops", "#27ae60",
                                                           "6 4")]
    seqs = [r["seq"] for r in rows]
    values = [r[key] for r in rows for _, key, _, _ in curves]
    chart = Chart(540, 360, title=f"per head, d={bill['head_dim']}, {bill['dtype']}")
    chart.scales(log_bounds(seqs, 1.6), log_bounds(values, 3), xlog=True, ylog=True)
    chart.axes("sequence length N", "bytes / FLOPs per head", xfmt=lambda v: si(v),
               yfmt=lambda v: si(v))
    if mark_seq:
        chart.line([mark_seq, mark_seq], [chart.y.lo, chart.y.hi], "#9aa5b1", 1, "3 3")
        chart.text(mark_seq, chart.y.hi, f"N={mark_seq:,}", dx=4, dy=14)
    for i, (label, key, color, dash) in enumerate(curves):
        chart.line(seqs, [r[key] for r in rows], color, 2, dash)
        for r in rows:
            unit = "FLOP" if key == "flops" else "B"
            chart.point(r["seq"], r[key], color, SHAPES[i], 4.5,
                        tip=f"N={r['seq']:,}: {label} = {si(r[key], unit)} ({r[key]:,})")
    chart.legend([(label, color, "dash" if dash else "line")
                  for label, _, color, dash in curves], x=chart.x0 + 10, y=chart.y1 + 8,
                 width=170)
    return chart.svg("chart-bill")


def ledger_chart(ledger: dict) -> str:
    scores = ledger["scores"]
    n, tile = len(scores), ledger["tile"]
    lo, hi = min(scores), max(scores)
    chart = Chart(540, 300, title=f"one score row, tiles of {tile}")
    chart.scales((0, n), (lo - 0.5, hi + 0.8))  # room above the spike for the legend
    chart.axes("position in the row", "score", xfmt=lambda v: f"{v:.0f}",
               yfmt=lambda v: f"{v:g}")
    for t in ledger["tiles"]:
        chart.rect(t["start"], hi + 0.8, t["stop"], lo - 0.5,
                   "#f3f5f8" if t["tile"] % 2 == 0 else "#fff")
        chart.line([t["start"], t["stop"]], [t["m_new"], t["m_new"]], ACCENT, 2.2,
                   tip=f"tile {t['tile']}: running max {t['m_new']:.4f}"
                       + (f"\nrescale exp(m_old − m_new) = {t['rescale']:.6g}"
                          if t["rescale"] is not None else ""))
    spike = ledger["spike"]["index"]
    for j, s in enumerate(scores):
        chart.point(j + 0.5, s, NAIVE if j == spike else FA2, "circle", 4.5 if j == spike else 2.6,
                    tip=f"s[{j}] = {s:.4f}" + (" (the spike)" if j == spike else ""))
    chart.legend([("scores", FA2, "circle"), ("running max m", ACCENT, "line"),
                  ("spike: a later, larger max", NAIVE, "circle")], x=chart.x0 + 8,
                 y=chart.y1 + 6, width=190)
    return chart.svg("chart-ledger")


def scatter_chart(rows: list[dict], pred_key: str, meas_key: str, title: str, unit: str,
                  chart_id: str) -> str:
    pts = [(r[meas_key], r[pred_key], r) for r in rows if r.get(meas_key) and r.get(pred_key)]
    chart = Chart(540, 400, title=title)
    if not pts:
        chart.scales((1, 10), (1, 10), xlog=True, ylog=True)
        chart.axes(f"measured ({unit})", f"predicted ({unit})")
        chart.text(1.5, 5, "no records with both values")
        return chart.svg(chart_id)
    lo, hi = log_bounds([v for p in pts for v in p[:2]], 1.5)
    chart.scales((lo, hi), (lo, hi), xlog=True, ylog=True)
    fmt = fmt_time if unit == "s" else (lambda v: si(v, unit))
    chart.axes(f"measured ({unit})", f"predicted ({unit})", xfmt=lambda v: si(v, unit),
               yfmt=lambda v: si(v, unit))
    chart.line([lo, hi], [lo, hi], "#1d2733", 1.4, tip="y = x: prediction equals measurement")
    for f, dash in ((1.1, "4 4"), (1 / 1.1, "4 4")):
        chart.line([lo, hi], [lo * f, hi * f], "#9aa5b1", 1, dash, tip="±10%")
    for meas, pred, r in pts:
        err = (pred - meas) / meas
        chart.point(meas, pred, SCHEDULE_COLORS.get(r.get("schedule"), GREY), "circle", 4.5,
                    tip=f"{r['label']}\nmeasured {fmt(meas)}\npredicted {fmt(pred)}\n"
                        f"error {err:+.1%}")
    return chart.svg(chart_id)
