"""A small SVG charting layer for the HTML report: axes, lines, points, rectangles, legends.

The report must open without a network and print well, so its charts are plain inline SVG
written here rather than a JavaScript library. Elements that deserve an exact number on hover
carry a ``data-tip`` attribute; the page's script shows it as a tooltip and adds zoom where a
chart is marked zoomable. Everything is drawn in pixel space of a fixed ``viewBox`` and scales
with the page width.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from html import escape


def attr(value: object) -> str:
    return escape(str(value), quote=True)


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``3.35e12, 'B/s' -> '3.35 TB/s'`` (decimal prefixes)."""
    if value == 0:
        return f"0 {unit}".strip()
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3),
                          ("", 1.0), ("m", 1e-3), ("µ", 1e-6), ("n", 1e-9)):
        if abs(value) >= scale * 0.9995:
            return f"{value / scale:.{digits}g} {prefix}{unit}".strip()
    return f"{value:.{digits}g} {unit}".strip()


def nice_step(span: float, target: int) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


class Scale:
    """Maps a data interval onto a pixel interval, linearly or in log10."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool = False):
        if log and (lo <= 0 or hi <= 0):
            raise ValueError("a log scale needs a positive domain")
        if hi == lo:
            lo, hi = (lo / 2, lo * 2) if log else (lo - 1, hi + 1)
        self.lo, self.hi, self.p0, self.p1, self.log = lo, hi, p0, p1, log

    def _t(self, v: float) -> float:
        return math.log10(v) if self.log else v

    def __call__(self, v: float) -> float:
        a, b = self._t(self.lo), self._t(self.hi)
        return self.p0 + (self._t(max(v, 1e-300) if self.log else v) - a) / (b - a) * (
            self.p1 - self.p0)

    def ticks(self, target: int = 6) -> list[float]:
        if self.log:
            first, last = math.ceil(math.log10(self.lo) - 1e-9), math.floor(math.log10(self.hi)
                                                                          + 1e-9)
            step = max(1, math.ceil((last - first + 1) / 8))
            decades = [10.0 ** e for e in range(first, last + 1, step)]
            if len(decades) >= 3:
                return decades
            for mantissas in ((1, 2, 5), range(1, 10)):  # a narrow range: fill in 2, 5, ...
                ticks = [m * 10.0 ** e for e in range(first - 1, last + 1) for m in mantissas
                         if self.lo <= m * 10.0 ** e <= self.hi]
                if len(ticks) >= 3:
                    return ticks
            return ticks
        step = nice_step(self.hi - self.lo, target)
        start = math.ceil(self.lo / step - 1e-9) * step
        n = int(math.floor((self.hi - start) / step + 1e-9)) + 1
        return [start + i * step for i in range(n)]


def log_bounds(values: Sequence[float], pad: float = 2.0) -> tuple[float, float]:
    """A log domain around positive ``values``, padded by a factor on both sides."""
    positive = [v for v in values if v and v > 0]
    return min(positive) / pad, max(positive) * pad


class Chart:
    """One SVG chart: a plot area with two scales and the marks drawn on it."""

    def __init__(self, width: int = 720, height: int = 400, margin=(34, 24, 52, 78),
                 title: str = ""):
        self.width, self.height, self.title = width, height, title
        self.top, self.right, self.bottom, self.left = margin
        self.x0, self.x1 = self.left, width - self.right
        self.y0, self.y1 = height - self.bottom, self.top
        self.x: Scale | None = None
        self.y: Scale | None = None
        self.back: list[str] = []  # grid and axes, under the marks
        self.marks: list[str] = []  # clipped to the plot area
        self.front: list[str] = []  # legend, labels: never clipped

    def scales(self, x: tuple[float, float], y: tuple[float, float], xlog: bool = False,
               ylog: bool = False) -> None:
        self.x = Scale(*x, self.x0, self.x1, xlog)
        self.y = Scale(*y, self.y0, self.y1, ylog)

    def axes(self, xlabel: str, ylabel: str, xfmt: Callable[[float], str] = si,
             yfmt: Callable[[float], str] = si, xticks: Sequence[float] | None = None,
             yticks: Sequence[float] | None = None, grid: bool = True) -> None:
        b = self.back
        for v in xticks if xticks is not None else self.x.ticks():
            px = self.x(v)
            if grid:
                b.append(f'<line class="grid" x1="{px:.1f}" x2="{px:.1f}" y1="{self.y1}" '
                         f'y2="{self.y0}"/>')
            b.append(f'<text class="tick" x="{px:.1f}" y="{self.y0 + 16}" '
                     f'text-anchor="middle">{escape(xfmt(v))}</text>')
        for v in yticks if yticks is not None else self.y.ticks():
            py = self.y(v)
            if grid:
                b.append(f'<line class="grid" x1="{self.x0}" x2="{self.x1}" y1="{py:.1f}" '
                         f'y2="{py:.1f}"/>')
            b.append(f'<text class="tick" x="{self.x0 - 6}" y="{py + 4:.1f}" '
                     f'text-anchor="end">{escape(yfmt(v))}</text>')
        b.append(f'<rect class="frame" x="{self.x0}" y="{self.y1}" '
                 f'width="{self.x1 - self.x0}" height="{self.y0 - self.y1}"/>')
        b.append(f'<text class="label" x="{(self.x0 + self.x1) / 2:.1f}" '
                 f'y="{self.height - 12}" text-anchor="middle">{escape(xlabel)}</text>')
        cy = (self.y0 + self.y1) / 2
        b.append(f'<text class="label" transform="translate(16,{cy:.1f}) rotate(-90)" '
                 f'text-anchor="middle">{escape(ylabel)}</text>')

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str, width: float = 2,
             dash: str = "", tip: str | None = None, cls: str = "") -> None:
        pts = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in zip(xs, ys, strict=True))
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' data-tip="{attr(tip)}"' if tip else ""
        self.marks.append(f'<polyline class="{cls}" points="{pts}" fill="none" '
                          f'stroke="{color}" stroke-width="{width}"{extra}/>')

    def point(self, x: float, y: float, color: str, shape: str = "circle", size: float = 6,
              tip: str | None = None, cls: str = "pt") -> None:
        px, py = self.x(x), self.y(y)
        extra = f' data-tip="{attr(tip)}"' if tip else ""
        self.marks.append(f'<path class="{cls}" d="{marker_path(shape, px, py, size)}" '
                          f'fill="{color}"{extra}/>')

    def rect(self, x: float, y: float, x2: float, y2: float, fill: str, tip: str | None = None,
             cls: str = "", extra: str = "") -> None:
        px0, px1 = sorted((self.x(x), self.x(x2)))
        py0, py1 = sorted((self.y(y), self.y(y2)))
        t = f' data-tip="{attr(tip)}"' if tip else ""
        self.marks.append(f'<rect class="{cls}" x="{px0:.2f}" y="{py0:.2f}" '
                          f'width="{max(px1 - px0, 0.3):.2f}" height="{max(py1 - py0, 0.3):.2f}" '
                          f'fill="{fill}"{t}{extra}/>')

    def text(self, x: float, y: float, s: str, cls: str = "note", anchor: str = "start",
             dx: float = 0, dy: float = 0, front: bool = True, fill: str | None = None) -> None:
        where = self.front if front else self.marks
        style = f' style="fill:{fill}"' if fill else ""
        where.append(f'<text class="{cls}" x="{self.x(x) + dx:.1f}" y="{self.y(y) + dy:.1f}" '
                     f'text-anchor="{anchor}"{style}>{escape(s)}</text>')

    def legend(self, items: Sequence[tuple[str, str, str]], x: float | None = None,
               y: float | None = None, width: float = 250) -> None:
        """``items``: (label, colour, kind) with kind ``line``, ``dash``, ``dot`` or a shape."""
        row = 17
        lx = self.x1 - width - 8 if x is None else x
        ly = self.y0 - row * len(items) - 10 if y is None else y
        self.front.append(f'<rect class="legend" x="{lx:.1f}" y="{ly:.1f}" width="{width}" '
                          f'height="{row * len(items) + 8}" rx="4"/>')
        for i, (label, color, kind) in enumerate(items):
            cy = ly + 4 + row * i + row / 2
            if kind in ("line", "dash", "dot", "dashdot"):
                dash = {"line": "", "dash": "6 4", "dot": "2 3", "dashdot": "8 3 2 3"}[kind]
                extra = f' stroke-dasharray="{dash}"' if dash else ""
                self.front.append(f'<line x1="{lx + 8:.1f}" x2="{lx + 30:.1f}" y1="{cy:.1f}" '
                                  f'y2="{cy:.1f}" stroke="{color}" stroke-width="2"{extra}/>')
            else:
                self.front.append(f'<path d="{marker_path(kind, lx + 19, cy, 5)}" '
                                  f'fill="{color}"/>')
            self.front.append(f'<text class="legend-text" x="{lx + 36:.1f}" y="{cy + 4:.1f}">'
                              f'{escape(label)}</text>')

    def svg(self, chart_id: str, cls: str = "", attrs: dict | None = None) -> str:
        extra = "".join(f' {k}="{attr(v)}"' for k, v in (attrs or {}).items())
        clip = f"clip-{attr(chart_id)}"
        title = (f'<text class="title" x="{self.x0}" y="{self.top - 12}">'
                 f'{escape(self.title)}</text>' if self.title else "")
        return (
            f'<svg id="{attr(chart_id)}" class="chart {cls}" viewBox="0 0 {self.width} '
            f'{self.height}" role="img" aria-label="{attr(self.title or chart_id)}"{extra}>'
            f'<defs><clipPath id="{clip}"><rect x="{self.x0}" y="{self.y1}" '
            f'width="{self.x1 - self.x0}" height="{self.y0 - self.y1}"/></clipPath></defs>'
            f'{title}{"".join(self.back)}'
            f'<g class="marks" clip-path="url(#{clip})">{"".join(self.marks)}</g>'
            f'{"".join(self.front)}</svg>'
        )


def marker_path(shape: str, x: float, y: float, r: float) -> str:
    """SVG path data of a marker centred on (x, y)."""
    if shape == "square":
        return f"M{x - r:.1f},{y - r:.1f}h{2 * r:.1f}v{2 * r:.1f}h{-2 * r:.1f}z"
    if shape == "diamond":
        return f"M{x:.1f},{y - r * 1.3:.1f}L{x + r * 1.3:.1f},{y:.1f}L{x:.1f},{y + r * 1.3:.1f}" \
               f"L{x - r * 1.3:.1f},{y:.1f}z"
    if shape == "triangle":
        return f"M{x:.1f},{y - r * 1.3:.1f}L{x + r * 1.2:.1f},{y + r * 0.8:.1f}" \
               f"L{x - r * 1.2:.1f},{y + r * 0.8:.1f}z"
    return (f"M{x - r:.1f},{y:.1f}a{r:.1f},{r:.1f} 0 1,0 {2 * r:.1f},0"
            f"a{r:.1f},{r:.1f} 0 1,0 {-2 * r:.1f},0z")


def color_scale(t: float) -> str:
    """A perceptually ordered ramp (viridis-like) from t = 0 (fast) to 1 (slow)."""
    stops = [(0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)),
             (0.75, (94, 201, 98)), (1.0, (253, 231, 37))]
    t = min(max(t, 0.0), 1.0)
    for (t0, c0), (t1, c1) in itertools.pairwise(stops):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1,
                                                                                 strict=True))
    return "#fde725"
