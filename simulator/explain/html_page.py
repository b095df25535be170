"""The report's page shell: inline CSS and script, the embedded data block, number spans.

The page must open from a file with no network: no CDN, no web fonts, no external images.
The script is progressive: without it every chart is still a complete SVG and every number
is text. With it, marks carrying ``data-tip`` show an exact tooltip, charts marked
``zoom-x`` (the timeline) zoom and pan along time with their axis redrawn, and charts
marked ``zoom-xy`` (the heatmap) zoom and pan as a picture. Print CSS drops the controls.
"""

from __future__ import annotations

import json
from html import escape

DATA_ID = "tilesim-data"

CSS = """
:root { --ink:#1d2733; --muted:#5b6776; --line:#d9dee5; --bg:#f6f7f9; --card:#fff;
  --naive:#c0392b; --fa2:#1f6fb2; --accent:#e67e22; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
header { background:#14202e; color:#f3f5f8; padding:22px 32px 18px; }
header h1 { margin:0 0 4px; font-size:23px; font-weight:650; letter-spacing:.2px; }
header .sub { color:#b9c3cf; font-size:14px; }
nav { position:sticky; top:0; z-index:5; background:#fff; border-bottom:1px solid var(--line);
  padding:8px 32px; font-size:13.5px; }
nav a { color:var(--fa2); text-decoration:none; margin-right:16px; white-space:nowrap; }
main { max-width:1180px; margin:0 auto; padding:18px 24px 48px; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px;
  padding:18px 22px; margin:18px 0; }
section h2 { margin:0 0 6px; font-size:19px; }
p.lead { margin:2px 0 12px; color:var(--muted); max-width:980px; }
.notice { background:#fff6e5; border:1px solid #f3d29a; border-radius:8px; padding:8px 12px;
  margin:10px 0 0; font-size:14px; }
.kpis { display:grid; grid-template-columns:repeat(auto-fit,minmax(190px,1fr)); gap:12px; }
.kpi { border:1px solid var(--line); border-radius:8px; padding:10px 14px; background:#fbfcfd; }
.kpi .k { color:var(--muted); font-size:12.5px; text-transform:uppercase; letter-spacing:.4px; }
.kpi .v { font-size:22px; font-weight:650; font-variant-numeric:tabular-nums; }
.kpi .d { color:var(--muted); font-size:13px; }
.grid2 { display:grid; grid-template-columns:1fr 1fr; gap:18px; align-items:start; }
.grid2.wide { grid-template-columns:1.35fr 1fr; }
@media (max-width:900px) { .grid2, .grid2.wide { grid-template-columns:1fr; } }
.figure { position:relative; }
svg.chart { width:100%; height:auto; display:block; background:#fff; }
svg.chart text { font-family:inherit; fill:var(--ink); }
svg.chart .tick { font-size:11.5px; fill:var(--muted); }
svg.chart .label { font-size:13px; fill:#33404f; }
svg.chart .title { font-size:14px; font-weight:600; }
svg.chart .note { font-size:11.5px; fill:#33404f; }
svg.chart .cell-text { font-size:12px; font-weight:600; pointer-events:none; }
svg.chart .lane-label { font-size:10px; fill:var(--muted); }
svg.chart .grid { stroke:#e8ebf0; stroke-width:1; }
svg.chart .frame { fill:none; stroke:#9aa5b1; stroke-width:1; }
svg.chart .legend { fill:#fff; fill-opacity:.92; stroke:#d0d6de; }
svg.chart .legend-text { font-size:11.5px; }
svg.chart [data-tip]:hover { opacity:.8; stroke:#111; stroke-width:1.2; }
svg.chart .best { fill:none; stroke:#fff; stroke-width:3; pointer-events:none; }
svg.chart .pt-label { font-size:11.5px; font-weight:700; paint-order:stroke;
  stroke:#fff; stroke-width:3.5px; stroke-linejoin:round; }
svg.zoom-x, svg.zoom-xy { cursor:grab; touch-action:none; }
.toolbar { position:absolute; right:6px; top:4px; display:flex; gap:4px; }
.toolbar button { font:inherit; font-size:12px; border:1px solid var(--line); background:#fff;
  border-radius:5px; padding:1px 8px; cursor:pointer; color:var(--ink); }
.hint { color:var(--muted); font-size:12.5px; margin:4px 0 0; }
.keys { color:var(--ink); font-size:13px; margin:0 0 4px; }
table.data { border-collapse:collapse; width:100%; font-size:13.5px;
  font-variant-numeric:tabular-nums; margin:8px 0; }
table.data th, table.data td { border-bottom:1px solid var(--line); padding:4px 8px;
  text-align:right; white-space:nowrap; }
table.data th { background:#f1f3f6; font-weight:600; }
table.data td:first-child, table.data th:first-child { text-align:left; }
table.data td.l, table.data th.l { text-align:left; white-space:normal; }
.table-wrap { overflow-x:auto; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px; }
.naive { color:var(--naive); } .fa2 { color:var(--fa2); }
ul.notes { color:var(--muted); font-size:13.5px; margin:8px 0 0; padding-left:20px; }
code { background:#eef1f5; padding:0 4px; border-radius:3px; font-size:90%; }
footer { color:var(--muted); font-size:12.5px; text-align:center; padding:8px; }
#tip { position:fixed; z-index:20; pointer-events:none; display:none; max-width:420px;
  background:#14202e; color:#f3f5f8; font-size:12.5px; line-height:1.45; padding:6px 9px;
  border-radius:6px; white-space:pre-line; box-shadow:0 2px 10px rgba(0,0,0,.25); }
@media print {
  body { background:#fff; font-size:11pt; }
  header { background:#fff; color:#000; padding:0 0 6px; border-bottom:2px solid #000; }
  header .sub { color:#333; }
  nav, .toolbar, .hint, #tip, .no-print { display:none !important; }
  main { max-width:none; padding:0; }
  section { border:none; border-top:1px solid #bbb; border-radius:0; padding:8px 0;
    break-inside:avoid; page-break-inside:avoid; }
  .grid2, .grid2.wide { grid-template-columns:1fr 1fr; }
  svg.chart { break-inside:avoid; }
  .table-wrap { overflow:visible; }
  table.data { font-size:9pt; }
  table.data th, table.data td { padding:2px 5px; }
  a { color:inherit; text-decoration:none; }
  @page { size:A4 landscape; margin:12mm; }
}
"""

SCRIPT = r"""
(function () {
  "use strict";
  var tip = document.getElementById("tip");
  document.addEventListener("mousemove", function (ev) {
    var el = ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (!el) { tip.style.display = "none"; return; }
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    var x = ev.clientX + 14, y = ev.clientY + 14, w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth - 8) { x = ev.clientX - w - 14; }
    if (y + h > window.innerHeight - 8) { y = ev.clientY - h - 14; }
    tip.style.left = x + "px"; tip.style.top = y + "px";
  });

  function svgX(svg, clientX) {
    var pt = svg.createSVGPoint(); pt.x = clientX; pt.y = 0;
    return pt.matrixTransform(svg.getScreenCTM().inverse()).x;
  }
  function svgPoint(svg, clientX, clientY) {
    var pt = svg.createSVGPoint(); pt.x = clientX; pt.y = clientY;
    return pt.matrixTransform(svg.getScreenCTM().inverse());
  }
  function toolbar(svg, zoomBy, reset) {
    var bar = document.createElement("div"); bar.className = "toolbar";
    [["+", function () { zoomBy(1.6); }], ["\u2212", function () { zoomBy(1 / 1.6); }],
     ["reset", reset]].forEach(function (b) {
      var btn = document.createElement("button"); btn.type = "button";
      btn.textContent = b[0]; btn.addEventListener("click", b[1]); bar.appendChild(btn);
    });
    svg.parentNode.appendChild(bar);
  }
  function fmtTime(s) {
    var a = Math.abs(s);
    if (a === 0) { return "0"; }
    if (a >= 1) { return +s.toPrecision(4) + " s"; }
    if (a >= 1e-3) { return +(s * 1e3).toPrecision(4) + " ms"; }
    if (a >= 1e-6) { return +(s * 1e6).toPrecision(4) + " \u00b5s"; }
    return +(s * 1e9).toPrecision(4) + " ns";
  }
  function niceStep(span, target) {
    var raw = span / target, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * mag >= raw) { return steps[i] * mag; } }
    return 10 * mag;
  }

  // Time zoom: marks live in g.zoom-layer drawn for the full domain [d0, d1] over pixels
  // [p0, p1]; zooming rescales that group along x and redraws the ticks in g.zoom-ticks.
  document.querySelectorAll("svg.zoom-x").forEach(function (svg) {
    var layer = svg.querySelector("g.zoom-layer"), ticks = svg.querySelector("g.zoom-ticks");
    var d0 = +svg.dataset.d0, d1 = +svg.dataset.d1, p0 = +svg.dataset.p0, p1 = +svg.dataset.p1;
    var yTop = +svg.dataset.ytop, yBot = +svg.dataset.ybot, a = d0, b = d1, drag = null;
    function px(v) { return p0 + (v - d0) / (d1 - d0) * (p1 - p0); }
    function draw() {
      var k = (d1 - d0) / (b - a);
      layer.setAttribute("transform", "translate(" + (p0 - px(a) * k) + ",0) scale(" + k + ",1)");
      var step = niceStep(b - a, 7), html = "";
      for (var v = Math.ceil(a / step) * step; v <= b + step * 1e-9; v += step) {
        var x = p0 + (v - a) / (b - a) * (p1 - p0);
        html += '<line class="grid" x1="' + x + '" x2="' + x + '" y1="' + yTop + '" y2="' +
          yBot + '"/><text class="tick" x="' + x + '" y="' + (yBot + 16) +
          '" text-anchor="middle">' + fmtTime(v) + "</text>";
      }
      ticks.innerHTML = html;
    }
    function zoomAt(center, factor) {
      var span = Math.max((b - a) / factor, (d1 - d0) * 1e-4);
      span = Math.min(span, d1 - d0);
      var f = (center - a) / (b - a);
      a = center - f * span; b = a + span;
      if (a < d0) { a = d0; b = d0 + span; }
      if (b > d1) { b = d1; a = d1 - span; }
      draw();
    }
    function dataAt(clientX) {
      var x = svgX(svg, clientX);
      return a + (Math.min(Math.max(x, p0), p1) - p0) / (p1 - p0) * (b - a);
    }
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault(); zoomAt(dataAt(ev.clientX), ev.deltaY < 0 ? 1.25 : 0.8);
    }, { passive: false });
    svg.addEventListener("pointerdown", function (ev) {
      drag = { x: svgX(svg, ev.clientX), a: a, b: b };
    });
    window.addEventListener("pointerup", function () { drag = null; });
    svg.addEventListener("pointermove", function (ev) {
      if (!drag) { return; }
      var shift = (svgX(svg, ev.clientX) - drag.x) / (p1 - p0) * (drag.b - drag.a);
      var span = drag.b - drag.a;
      a = Math.min(Math.max(drag.a - shift, d0), d1 - span); b = a + span; draw();
    });
    function reset() { a = d0; b = d1; draw(); }
    svg.addEventListener("dblclick", reset);
    toolbar(svg, function (f) { zoomAt((a + b) / 2, f); }, reset);
    draw();
  });

  // Picture zoom: the viewBox shrinks around the cursor; drag pans; double-click resets.
  document.querySelectorAll("svg.zoom-xy").forEach(function (svg) {
    var full = svg.viewBox.baseVal, W = full.width, H = full.height;
    var box = { x: 0, y: 0, w: W, h: H }, drag = null;
    function apply() {
      box.w = Math.min(box.w, W); box.h = Math.min(box.h, H);
      box.x = Math.min(Math.max(box.x, 0), W - box.w);
      box.y = Math.min(Math.max(box.y, 0), H - box.h);
      svg.setAttribute("viewBox", box.x + " " + box.y + " " + box.w + " " + box.h);
    }
    function zoomAt(p, factor) {
      var w = Math.max(box.w / factor, W / 20), h = w * H / W;
      box.x = p.x - (p.x - box.x) * w / box.w; box.y = p.y - (p.y - box.y) * h / box.h;
      box.w = w; box.h = h; apply();
    }
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      zoomAt(svgPoint(svg, ev.clientX, ev.clientY), ev.deltaY < 0 ? 1.25 : 0.8);
    }, { passive: false });
    svg.addEventListener("pointerdown", function (ev) {
      drag = { p: svgPoint(svg, ev.clientX, ev.clientY), x: box.x, y: box.y };
    });
    window.addEventListener("pointerup", function () { drag = null; });
    svg.addEventListener("pointermove", function (ev) {
      if (!drag) { return; }
      var p = svgPoint(svg, ev.clientX, ev.clientY);
      box.x -= p.x - drag.p.x; box.y -= p.y - drag.p.y; apply();
    });
    function reset() { box = { x: 0, y: 0, w: W, h: H }; apply(); }
    svg.addEventListener("dblclick", reset);
    toolbar(svg, function (f) { zoomAt({ x: box.x + box.w / 2, y: box.y + box.h / 2 }, f); },
            reset);
  });

  // The embedded data, offered as a download; parsing it here also proves it is valid JSON.
  var data = JSON.parse(document.getElementById("tilesim-data").textContent);
  var link = document.getElementById("download-json");
  if (link) {
    link.href = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)],
                                             { type: "application/json" }));
  }
})();
"""


def number(key: str, value: float | int | None, text: str) -> str:
    """A key number as text, with its exact value in ``data-value`` (``null`` when absent)."""
    raw = "null" if value is None else json.dumps(value)
    return (f'<span class="num" data-key="{escape(key, quote=True)}" '
            f'data-value="{escape(raw, quote=True)}">{escape(text)}</span>')


def embed_json(data: dict) -> str:
    """JSON safe inside a ``<script>`` element: no ``<`` at all, so nothing can close it."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def page(title: str, header_html: str, nav: list[tuple[str, str]], body: str,
         data: dict) -> str:
    links = "".join(f'<a href="#{escape(anchor, quote=True)}">{escape(label)}</a>'
                    for anchor, label in nav)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><link rel=\"icon\" href=\"data:,\">"
        f"<style>{CSS}</style></head><body>"
        f"<header>{header_html}</header><nav>{links}"
        "<a id=\"download-json\" class=\"no-print\" download=\"tilesim-report.json\" "
        "href=\"#\">data (JSON)</a></nav>"
        f"<main>{body}</main><div id=\"tip\"></div>"
        f"<script type=\"application/json\" id=\"{DATA_ID}\">{embed_json(data)}</script>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
