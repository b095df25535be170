"""Helpers the explainers share: parsing user numbers, number formatting, saving figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traces.problem import ProblemError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_FORMATS = {".png": "png", ".svg": "svg"}


def parse_int_list(text: str, name: str) -> list[int]:
    """``"512,2048"`` -> ``[512, 2048]``; every entry a positive integer."""
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(not item for item in items):
        raise ProblemError(f'"{name}" must be a comma-separated list of integers, got {text!r}.')
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ProblemError(
                f'"{name}" must be a comma-separated list of integers, got {text!r}.'
            ) from None
    for value in values:
        check_positive(value, name)
    return values


def parse_int(text: str, name: str) -> int:
    """One positive integer from user text."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ProblemError(f'"{name}" must be a positive integer, got {text!r}.') from None
    check_positive(value, name)
    return value


def parse_seed(text: str) -> int:
    """A non-negative integer seed from user text."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ProblemError(f'"seed" must be a non-negative integer, got {text!r}.') from None
    check_seed(value)
    return value


def check_positive(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ProblemError(f'"{name}" must be a positive integer, got {value!r}.')


def check_seed(value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProblemError(f'"seed" must be a non-negative integer, got {value!r}.')


def plot_format(path: str | Path) -> str:
    """The matplotlib format for ``path`` by its suffix; checked before any work is done."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise ProblemError(f"plot file {str(path)!r} must end in .png or .svg.")
    return PLOT_FORMATS[suffix]


def check_plot_path(path: str | Path | None) -> None:
    """Before any work is done: ``path`` (if given) ends in .png or .svg and its directory
    is writable, so that a mistyped plot path fails at once instead of after the work."""
    from simulator.cli.common import check_output_paths

    if path is not None:
        plot_format(path)
        check_output_paths(path)


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas, without pyplot (no global backend state is touched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write ``fig`` to ``path`` (PNG or SVG by suffix) atomically."""
    from simulator.cli.common import write_atomically

    fmt = plot_format(path)
    write_atomically(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))


def fmt_bytes(n: float) -> str:
    """Binary units: ``1536 -> '1.50 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_flops(n: float) -> str:
    """Decimal units: ``2.5e9 -> '2.50 GFLOP'``."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP"
