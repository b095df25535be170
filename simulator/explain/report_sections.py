"""The report's sections as HTML: text, tables and the charts of ``report_charts``.

Every key number is written through ``Page.num(path, fmt)``: the span's ``data-key`` is the
value's path in the embedded JSON and ``data-value`` the value itself, so the page cannot
show a number that is not in its data.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from simulator.explain import html_page, model, report_charts, roofline
from simulator.explain.report_charts import fmt_bytes, fmt_time
from simulator.explain.svgplot import si


def lookup(data: dict, path: str):
    """The value at a dotted path (``compare.fa2.time_s``, ``bill.rows.0.seq``)."""
    value = data
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


class Page:
    def __init__(self, data: dict):
        self.data = data

    def num(self, path: str, fmt: Callable[[object], str] = str) -> str:
        value = lookup(self.data, path)
        return html_page.number(path, value, "-" if value is None else fmt(value))


def pct(v: float) -> str:
    return f"{v:.1%}"


def signed_pct(v: float) -> str:
    return f"{v:+.1%}"


def times(v: float) -> str:
    return f"{v:,.1f}×"


def rate(v: float) -> str:
    return si(v, "FLOP/s")


def section(anchor: str, title: str, lead: str, body: str) -> str:
    return (f'<section id="{anchor}"><h2>{escape(title)}</h2><p class="lead">{lead}</p>'
            f"{body}</section>")


def table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """An HTML table; cells are HTML already (escape text before passing it)."""
    th = "".join(f'<th class="{"l" if i < left else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return (f'<div class="table-wrap"><table class="data"><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def kpi(title: str, value: str, detail: str = "") -> str:
    return (f'<div class="kpi"><div class="k">{escape(title)}</div><div class="v">{value}</div>'
            f'<div class="d">{detail}</div></div>')


def figure(svg: str, hint: str = "") -> str:
    return f'<div class="figure">{svg}</div>' + (f'<p class="hint">{hint}</p>' if hint else "")


def overview(p: Page) -> str:
    d = p.data
    best = d["sweep"]["best"]
    kpis = [
        kpi("FA2 time", p.num("compare.fa2.time_s", fmt_time),
            f'{p.num("compare.fa2.tflops_per_s", tflops)} TFLOP/s, '
            f'{p.num("compare.fa2.bound")}-bound'),
        naive_kpi(p),
        kpi("FA2 speed-up", p.num("compare.speedup", times), "naive time / FA2 time"),
        kpi("DRAM bytes", p.num("compare.fa2.dram_bytes", fmt_bytes),
            f'FA2; naive {p.num("compare.naive.dram_bytes", fmt_bytes)}'),
        kpi("HBM footprint", p.num("compare.fa2.hbm_footprint_bytes", fmt_bytes),
            f'FA2; naive {p.num("compare.naive.hbm_footprint_bytes", fmt_bytes)} '
            f'({p.num("compare.footprint_ratio", times)})'),
        kpi("ridge point", p.num("roofline.ceilings.ridge_points.tensor",
                                 lambda v: f"{v:.0f} FLOP/B"),
            f'{escape(d["hardware"]["display_name"])}, {escape(d["problem"]["dtype"])}'),
    ]
    if best:
        kpis.append(kpi("best tiling (sweep)",
                        f'{p.num("sweep.best.block_m")}×{p.num("sweep.best.block_n")}',
                        f'block_m×block_n, {p.num("sweep.best.time_s", fmt_time)}'))
    body = f'<div class="kpis">{"".join(kpis)}</div>'
    return section("overview", "Overview",
                   f'{escape(d["problem_text"])} on {escape(d["hardware"]["display_name"])}, '
                   f'tiling {escape(_tiling(d["tiling"]))}.', body)


def naive_kpi(p: Page) -> str:
    """Naive attention's time, or that it cannot run: its tensors outgrow the GPU's HBM."""
    if p.data["compare"]["naive"]["note"]:
        return kpi("naive time", "does not fit",
                   f'its tensors need {p.num("compare.naive.hbm_footprint_bytes", fmt_bytes)}, '
                   f'the GPU has {p.num("hardware.hbm_bytes", fmt_bytes)}: counted, not timed')
    return kpi("naive time", p.num("compare.naive.time_s", fmt_time),
               f'{p.num("compare.naive.tflops_per_s", tflops)} TFLOP/s, '
               f'{p.num("compare.naive.bound")}-bound')


def tflops(v: float) -> str:
    """TFLOP/s with three significant digits for small problems (0.0123, not 0)."""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3g}"


def _tiling(t: dict) -> str:
    return f"BM={t['block_m']} BN={t['block_n']} stages={t['num_stages']} warps={t['num_warps']}"


def roofline_section(p: Page) -> str:
    r = p.data["roofline"]
    rows = []
    for i, k in enumerate(r["kernels"]):
        base = f"roofline.kernels.{i}"
        rows.append([str(i + 1),
            f'<span class="swatch" style="background:'
            f'{report_charts.SCHEDULE_COLORS.get(k["schedule"], "#888")}"></span>'
            f'{escape(k["schedule"])}', escape(k["name"]),
            p.num(f"{base}.flops", lambda v: si(v, "FLOP")),
            p.num(f"{base}.dram_bytes", fmt_bytes),
            p.num(f"{base}.intensity", lambda v: f"{v:,.1f}"),
            p.num(f"{base}.attainable_flops_per_s", rate),
            p.num(f"{base}.bound"),
            p.num(f"{base}.tensor_utilisation", pct),
            p.num(f"{base}.model_time_s", fmt_time),
        ])
    kernels = table(["#", "schedule", "kernel", "FLOPs", "DRAM bytes", "FLOP/B", "attainable",
                     "bound", "tensor util.", "model time"], rows, left=3)
    c = "roofline.ceilings"
    roofs = table(["roof", "datasheet", "achievable", "ridge (FLOP/B)"], [
        ["tensor cores", p.num(f"{c}.tensor_flops_per_s", rate),
         p.num(f"{c}.tensor_achievable_flops_per_s", rate),
         p.num(f"{c}.ridge_points.tensor", lambda v: f"{v:.1f}") + " / "
         + p.num(f"{c}.ridge_points.tensor_achievable", lambda v: f"{v:.1f}")],
        ["HBM", p.num(f"{c}.hbm_bytes_per_s", lambda v: si(v, "B/s")),
         p.num(f"{c}.hbm_achievable_bytes_per_s", lambda v: si(v, "B/s")), ""],
        ["exp unit × " + p.num(f"{c}.flops_per_exp", lambda v: f"{v:.0f}") + " FLOP/exp",
         p.num(f"{c}.exp_ceiling_flops_per_s", rate), "",
         p.num(f"{c}.ridge_points.exp", lambda v: f"{v:.1f}")],
        ["fp32 ALUs", p.num(f"{c}.fp32_flops_per_s", rate), "",
         p.num(f"{c}.ridge_points.fp32", lambda v: f"{v:.1f}")],
    ])
    notes = "".join(f"<li>{escape(n)}</li>" for n in roofline.notes(r))
    chart = figure(report_charts.roofline_chart(r), "Hover a point or a roof for its numbers.")
    body = (f'<div class="grid2 wide"><div>{chart}</div>'
            f'<div>{roofs}<ul class="notes">{notes}</ul></div></div>{kernels}')
    return section("roofline", "Roofline",
                   "Every kernel of naive and FA2 attention at its arithmetic intensity (all "
                   "FLOPs per DRAM byte), under the roofs of the preset. Left of the ridge a "
                   "kernel waits on HBM; right of it on its compute units.", body)


def compare_section(p: Page) -> str:
    cmp = p.data["compare"]
    lines = [("time", "time_s", fmt_time), ("achieved TFLOP/s (paper FLOPs)", "tflops_per_s",
                                            tflops),
             ("bound", "bound", str), ("global read", "bytes.global_read", fmt_bytes),
             ("global write", "bytes.global_write", fmt_bytes),
             ("DRAM read", "bytes.dram_read", fmt_bytes),
             ("DRAM write", "bytes.dram_write", fmt_bytes),
             ("SRAM read", "bytes.smem_read", fmt_bytes),
             ("HBM footprint (tensors held)", "hbm_footprint_bytes", fmt_bytes),
             ("SRAM per CTA (peak)", "sram_peak_bytes_per_cta", fmt_bytes),
             ("CTAs per SM", "ctas_per_sm", str)]
    rows = []
    for label, key, fmt in lines:
        a, b = lookup(cmp, f"naive.{key}"), lookup(cmp, f"fa2.{key}")
        ratio = (f"{a / b:,.2f}×" if isinstance(a, (int, float)) and isinstance(b, (int, float))
                 and b and not isinstance(a, bool) else "")
        rows.append([escape(label), p.num(f"compare.naive.{key}", fmt),
                     p.num(f"compare.fa2.{key}", fmt), ratio])
    head = ["", '<span class="naive">naive</span>', '<span class="fa2">FA2</span>',
            "naive / FA2"]
    notes = "".join(f'<p class="hint">{escape(cmp[name]["note"])}; its traffic is counted, '
                    "not timed.</p>" for name in ("naive", "fa2") if cmp[name]["note"])
    body = (f'<div class="grid2"><div>{figure(report_charts.time_chart(cmp))}'
            f"{table(head, rows)}{notes}</div>"
            f'<div>{figure(report_charts.bytes_chart(cmp))}</div></div>')
    return section("compare", "Naive vs FA2",
                   "The same problem and tiling, both schedules: naive writes the N×N scores "
                   "S and probabilities P to HBM and reads them back; FA2 keeps each tile on "
                   "chip and writes only O and the log-sum-exp.", body)


def sweep_section(p: Page) -> str:
    sw = p.data["sweep"]
    ranked = sorted((c for c in sw["cells"] if c["legal"]), key=lambda c: c["time_s"])
    index = {id(c): i for i, c in enumerate(sw["cells"])}
    rows = []
    for rank, c in enumerate(ranked[:6], start=1):
        base = f"sweep.cells.{index[id(c)]}"
        rows.append([f"{rank}{' ★' if rank == 1 else ''}",
                     f'{p.num(base + ".block_m")}×{p.num(base + ".block_n")}',
                     p.num(base + ".time_s", fmt_time), p.num(base + ".dram_bytes", fmt_bytes),
                     p.num(base + ".sram_bytes_per_cta", fmt_bytes),
                     p.num(base + ".ctas_per_sm"), p.num(base + ".bound")])
    ranking = table(["rank", "BM×BN", "time", "DRAM bytes", "SRAM/CTA", "CTAs/SM", "bound"],
                    rows, left=2)
    chart = figure(report_charts.heatmap_chart(sw), "Scroll or use + / − to zoom, drag to "
                   "pan, double-click to reset. The best tiling is outlined.")
    caveat = (f'<p class="hint">Tied tilings differ in block_n: {escape(model.OPERAND_CAVEAT)}.'
              "</p>" if model.ties_differ_in_block_n(
                  [(c["block_n"], c["time_s"], c["bound"]) for c in ranked]) else "")
    body = f'<div class="grid2"><div>{chart}</div><div>{ranking}{caveat}</div></div>'
    registers = {("table",): "registers, spills and instruction counts from tilesim's "
                             "table of compiles",
                 ("estimated",): "registers estimated from the tiles"}.get(
                     tuple(sw.get("resources", ())), "registers " + ", ".join(
                         sw.get("resources", ())))
    return section("sweep", "Tile sweep",
                   f"Simulated FA2 time over block_m × block_n "
                   f"(stages {sw['num_stages']}, warps {sw['num_warps']}; {registers}); grey "
                   "cells do not fit an SM.", body)


def timeline_section(p: Page) -> str:
    tl = p.data["timeline"]
    tones = report_charts.KERNEL_TONES
    legend = " ".join(
        f'<span class="swatch" style="background:{tones[i % len(tones)][0]}"></span>'
        f'{escape(k["name"])} ({p.num(f"timeline.kernels.{i}.grid", lambda v: f"{v:,}")} '
        f'CTAs, {p.num(f"timeline.kernels.{i}.time_s", fmt_time)}) &nbsp;'
        for i, k in enumerate(tl["kernels"]))
    body = (f'<p class="keys">{legend}</p>'
            + figure(report_charts.timeline_chart(tl),
                     "Scroll or use + / − to zoom in time, drag to pan, double-click to reset. "
                     "Hover a bar for its CTA."))
    return section("timeline", "Timeline of the best tiling",
                   f"{escape(tl['schedule'])} with {escape(_tiling(tl['tiling']))}: one row per "
                   f"SM, a sub-row per resident CTA slot, as the timing simulator ran it. Total "
                   f"{p.num('timeline.time_s', fmt_time)}.", body)


def bill_section(p: Page) -> str:
    b = p.data["bill"]
    rows = [[p.num(f"bill.rows.{i}.seq", lambda v: f"{v:,}"),
             p.num(f"bill.rows.{i}.s_bytes", fmt_bytes),
             p.num(f"bill.rows.{i}.sp_bytes", fmt_bytes),
             p.num(f"bill.rows.{i}.flops", lambda v: si(v, "FLOP")),
             p.num(f"bill.rows.{i}.qkvo_bytes", fmt_bytes),
             p.num(f"bill.rows.{i}.s_over_qkvo", times)] for i in range(len(b["rows"]))]
    tab = table(["N", "S bill 2·N²·s", "S+P 4·N²·s", "FLOPs 4·N²·d", "Q,K,V,O 4·N·d·s",
                 "S bill / QKVO"], rows)
    d, s = b["head_dim"], b["elem_bytes"]
    chart = figure(report_charts.bill_chart(b, p.data["problem"]["seq_kv"]))
    body = (f'<div class="grid2"><div>{chart}</div>'
            f'<div>{tab}<ul class="notes"><li>Per FLOP the score matrix costs a constant '
            f"s/(2d) = {s}/{2 * d} bytes: bytes and FLOPs both grow as N².</li><li>Against "
            f"the Q, K, V, O traffic the S bill grows as N/(2d) = N/{2 * d}: the bytes a "
            "tiled kernel never sends to HBM.</li></ul></div></div>")
    return section("bill", "The N² bill",
                   "What naive attention's N×N score matrix costs per head, written and read "
                   "back, against the FLOPs of the same work.", body)


def ledger_section(p: Page) -> str:
    lg = p.data["ledger"]
    rows = []
    for i, t in enumerate(lg["tiles"]):
        base = f"ledger.tiles.{i}"
        rows.append([str(t["tile"]), p.num(base + ".tile_max", lambda v: f"{v:.4f}"),
                     p.num(base + ".m_new", lambda v: f"{v:.4f}"),
                     p.num(base + ".rescale", lambda v: f"{v:.4g}"),
                     p.num(base + ".running_sum", lambda v: f"{v:.5g}"),
                     p.num(base + ".no_rescale_sum", lambda v: f"{v:.5g}")])
    tab = table(["tile", "tile max", "running max", "rescale", "running sum",
                 "no-rescale sum"], rows)
    agree = (f'<ul class="notes"><li>Online softmax vs full softmax (float64): max weight '
             f'difference {p.num("ledger.agreement.weights_max_abs_diff", lambda v: f"{v:.1e}")}'
             f' (tolerance {p.num("ledger.agreement.tolerance", lambda v: f"{v:.0e}")}).</li>'
             f'<li>The streamer that skips the rescale: weights off by '
             f'{p.num("ledger.no_rescale.weights_rel_err", pct)} (L1), output off by '
             f'{p.num("ledger.no_rescale.output_rel_err", pct)} — yet its weights still sum '
             "to one, so nothing looks wrong.</li></ul>")
    body = (f'<div class="grid2"><div>{figure(report_charts.ledger_chart(lg))}</div>'
            f"<div>{tab}{agree}</div></div>")
    return section("ledger", "The online-softmax ledger",
                   f"One row of {lg['seq']} scores streamed in tiles of {lg['tile']}: when a "
                   "tile brings a larger max, everything summed so far is multiplied by "
                   "exp(m_old − m_new).", body)


def records_section(p: Page) -> str:
    rec = p.data["records"]
    if not rec:
        return section("records", "Predicted vs measured",
                       "No validation records given: run <code>tilesim report --records "
                       "validation/records/*.jsonl</code> to compare with real GPU runs.", "")
    s = "records.summary"
    kpis = "".join([
        kpi("time MAPE", p.num(f"{s}.time.mape", pct),
            f'max {p.num(f"{s}.time.max_abs", pct)}, {p.num(f"{s}.time.n")} records'),
        kpi("DRAM bytes MAPE", p.num(f"{s}.dram.mape", pct),
            f'max {p.num(f"{s}.dram.max_abs", pct)}, {p.num(f"{s}.dram.n")} records'),
        kpi("tiling rank (Spearman, min)", p.num(f"{s}.spearman_min", lambda v: f"{v:.2f}"),
            "per shape, predicted vs measured order"),
        kpi("regret of predicted best", p.num(f"{s}.regret_max_pct", lambda v: f"{v:.1f}%"),
            "max over shapes"),
    ])
    if rec["synthetic"]:
        kpis += ('<p class="notice"><b>Synthetic records:</b> some of these records are '
                 "made-up test fixtures, not measurements on a GPU.</p>")
    rows = []
    for i, r in enumerate(rec["rows"]):
        base = f"records.rows.{i}"
        rows.append([escape(r["label"]), p.num(base + ".measured_time_s", fmt_time),
                     p.num(base + ".predicted_time_s", fmt_time),
                     p.num(base + ".time_err", signed_pct),
                     p.num(base + ".measured_dram_bytes", fmt_bytes),
                     p.num(base + ".predicted_dram_bytes", fmt_bytes),
                     p.num(base + ".dram_err", signed_pct)])
    tab = table(["config", "measured time", "predicted", "error", "measured DRAM",
                 "predicted", "error"], rows)
    skipped = "".join(f"<li>{escape(x['label'])}: {escape(x['reason'])}</li>"
                      for x in rec.get("skipped", []))
    fit_time = report_charts.scatter_chart(rec["rows"], "predicted_time_s", "measured_time_s",
                                           "time", "s", "chart-fit-time")
    fit_dram = report_charts.scatter_chart(rec["rows"], "predicted_dram_bytes",
                                           "measured_dram_bytes", "DRAM bytes", "B",
                                           "chart-fit-dram")
    charts = (f'<div class="grid2"><div>{figure(fit_time)}</div>'
              f"<div>{figure(fit_dram)}</div></div>")
    errors = "".join(f"<li>{escape(e)}</li>" for e in rec.get("line_errors", []))
    body = (f'<div class="kpis">{kpis}</div>{charts}{tab}'
            + (f'<p class="keys">Not compared:</p><ul class="notes">{skipped}</ul>'
               if skipped else "")
            + (f'<p class="keys">Lines that could not be read:</p><ul class="notes">{errors}'
               "</ul>" if errors else ""))
    return section("records", "Predicted vs measured",
                   f"Validation records against the model ({escape(rec['source'])}); error is "
                   "(predicted − measured) / measured; dashed lines are ±10%.", body)


NAV = [("overview", "Overview"), ("roofline", "Roofline"), ("compare", "Naive vs FA2"),
       ("sweep", "Tile sweep"), ("timeline", "Timeline"), ("bill", "N² bill"),
       ("ledger", "Ledger"), ("records", "Measured")]


def page_html(data: dict) -> str:
    p = Page(data)
    header = (f"<h1>tilesim report</h1><div class=\"sub\">{escape(data['problem_text'])} · "
              f"{escape(data['hardware']['display_name'])} · {escape(_tiling(data['tiling']))}"
              f" · model: {escape(data['model']['source'])} · tilesim "
              f"{escape(data['tool_version'])}</div>")
    body = "".join(f(p) for f in (overview, roofline_section, compare_section, sweep_section,
                                  timeline_section, bill_section, ledger_section,
                                  records_section))
    body += ("<footer>Every number on this page is in the embedded JSON "
             "(<code>#tilesim-data</code>); the race on a real CPU is <code>tilesim "
             "race</code>.</footer>")
    return html_page.page(f"tilesim report — {data['problem_text']}", header, NAV, body, data)
