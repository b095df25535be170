"""``tilesim hardware``: list the shipped GPU presets, or show one preset (or TOML file) in full.

``tilesim hardware`` alone lists (``--json`` as ``list --json``). ``show`` prints every field
with its unit in a form people read (KiB, TB/s, ns); ``show --json`` prints the loaded values
in SI units, as the loader returns them, so that scripts get exactly what the model uses.
"""

from __future__ import annotations

import argparse

from simulator.hardware import Hardware, load_hardware, preset_names

_BINARY_PREFIXES = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))
_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hardware",
        help="list GPU presets or show one",
        description="List the GPU presets, or show every number of one preset or TOML file.",
    )
    parser.set_defaults(func=run)
    parser.add_argument("--json", dest="json_list", action="store_true",
                        help="as `list --json` (or `show --json`): every field as JSON, SI units")
    actions = parser.add_subparsers(dest="hardware_action", metavar="ACTION",
                                    parser_class=type(parser))
    listing = actions.add_parser("list", help="table of the shipped presets (default)")
    listing.add_argument("--json", action="store_true",
                         help="print every preset's fields as JSON (SI units)")
    show = actions.add_parser("show", help="all fields of one preset or TOML file")
    show.add_argument("name", metavar="NAME_OR_PATH", help="preset name or path to a .toml file")
    show.add_argument("--json", action="store_true", help="print the fields as JSON (SI units)")
    from simulator.cli.common import add_set_arg

    add_set_arg(show)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "hardware_action", None) == "show":
        from simulator.cli.common import hardware_from_args

        hw = hardware_from_args(args, args.name)
        if args.json or args.json_list:
            from simulator.cli.common import print_json

            print_json(hw.to_dict())
        else:
            _print_show(hw)
        return 0
    presets = [load_hardware(name) for name in preset_names()]
    if getattr(args, "json", False) or args.json_list:
        from simulator.cli.common import print_json

        print_json({"presets": [hw.to_dict() for hw in presets]})
        return 0
    _print_list(presets)
    return 0


def _console():
    from simulator.cli.common import output_console

    return output_console(width=120)


def _print_list(presets: list[Hardware]) -> None:
    from rich.table import Table

    table = Table(title="tilesim hardware presets")
    table.add_column("name", no_wrap=True)
    table.add_column("display name")
    for header in ("SMs", "SMEM/SM", "L2", "HBM BW", "bf16 TFLOPS"):
        table.add_column(header, justify="right")
    for hw in presets:
        table.add_row(
            hw.name, hw.display_name, str(hw.sm_count), _binary(hw.smem_per_sm_bytes),
            _binary(hw.l2_bytes), _si(hw.hbm_bandwidth_bytes_per_s, "B/s"),
            f"{hw.tensor_flops_per_s['bf16'] / 1e12:g}",
        )
    console = _console()
    console.print(table)
    console.print("Show one: tilesim hardware show NAME (or a path to your own .toml).")


def _print_show(hw: Hardware) -> None:
    from rich.table import Table

    table = Table(title=f"{hw.display_name} ({hw.name})")
    table.add_column("field", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("SI value", justify="right", no_wrap=True)
    for key, value in hw.to_dict().items():
        if key in ("name", "display_name"):
            continue
        if key == "tensor_flops_per_s":
            for dtype, rate in value.items():
                label = "tf32" if dtype == "fp32" else dtype
                table.add_row(f"tensor_flops_per_s.{dtype}", f"{_si(rate, 'FLOP/s')} ({label})",
                              _exact(rate))
            continue
        if value is None:  # an optional field the preset leaves out
            table.add_row(key, "not given", "")
            continue
        table.add_row(key, _human(key, value), _exact(value))
    table.add_section()
    table.add_row("hbm effective", _si(hw.hbm_effective_bytes_per_s, "B/s"), "")
    table.add_row("l2 effective", _si(hw.l2_effective_bytes_per_s, "B/s"), "")
    table.add_row("bf16 tensor effective", _si(hw.tensor_rate("bf16"), "FLOP/s"), "")
    _console().print(table)


def _human(key: str, value: float) -> str:
    """Readable value with unit, chosen from the unit suffix of the field name."""
    if key.endswith("_efficiency"):
        return f"{value * 100:.4g} %"
    if key.endswith("_bytes_per_clk_per_sm"):
        return f"{value:g} B/clk/SM"
    if key.endswith("_bytes_per_s"):
        return _si(value, "B/s")
    if key.endswith("_flops_per_s"):
        return _si(value, "FLOP/s")
    if key.endswith("_ops_per_s"):
        return _si(value, "op/s")
    if key.endswith("_hz"):
        return _si(value, "Hz")
    if key.endswith("_s"):
        return _seconds(value)
    if key.endswith("_bytes") and value >= 1024:
        return _binary(value)
    if key.endswith("_bytes"):
        return f"{value:g} B"
    return f"{value:,}"


def _exact(value: float) -> str:
    """The loaded number without rounding (floats to 10 significant digits)."""
    return str(value) if isinstance(value, int) else f"{value:.10g}"


def _binary(n: float) -> str:
    for scale, unit in _BINARY_PREFIXES:
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:g} B"


def _si(value: float, unit: str) -> str:
    for scale, prefix in _SI_PREFIXES:
        if value >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _seconds(value: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"
