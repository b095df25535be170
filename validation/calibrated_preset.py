"""A calibrated preset: the base preset's TOML with the fitted values and their provenance.

``calibrated_toml`` writes each fitted field in place, with the base value and its source
in the comment, renames the preset, and puts in front a header that says which records
(files with their hashes: ``record_sources``), which training and held-out shapes, which
loop facts, and the held-out error before and after the fit (``validation.calibrate``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from traces.problem import ProblemError


def _toml_value(v) -> str:
    """Six significant digits: the fit is not better than that, and people read presets."""
    return repr(float(f"{float(v):.6g}"))


def calibrated_toml(base_text: str, report: dict, name: str, sources: list[str]) -> str:
    """The base preset's text with the fitted values (and provenance) written in."""
    fitted_hw = report["hardware"]
    lines = base_text.splitlines()
    for p in report["params"]:
        pattern = re.compile(rf"^(\s*){re.escape(p['field'])}\s*=\s*([^#]*?)\s*(#\s*(.*))?$")
        for i, line in enumerate(lines):
            m = pattern.match(line)
            if m:
                was = m.group(4) or "no source"
                lines[i] = (f"{m.group(1)}{p['field']} = {_toml_value(p['fitted'])}  # fitted by "
                            f"tilesim calibrate (base {m.group(2)}: {was})")
                break
        else:
            raise ProblemError(f"the base preset has no line for {p['field']}")
    for i, line in enumerate(lines):
        if re.match(r"^name\s*=", line):
            lines[i] = f'name = "{name}"'
        elif re.match(r"^display_name\s*=", line):  # once, however often it is refitted
            label = fitted_hw.display_name
            while label.endswith(" (calibrated)"):
                label = label.removesuffix(" (calibrated)")
            lines[i] = f'display_name = "{label} (calibrated)"'
    held = report["held_out"]
    header = [
        f"# Calibrated from preset {report['base']}: fitted by tilesim calibrate from records:",
        *[f"#   {s}" for s in sources],
        f"# Fit: least squares on log(predicted/measured time), {report['n_train']} records "
        f"of {len(report['train_shapes'])} training shapes; split by shape (seed "
        f"{report['seed']}, held-out fraction {report['holdout_fraction']}"
        f"{_filters(report)}).",
        *loop_facts_line(report.get("loop_facts_filled"),
                          report.get("loop_facts_as_recorded", False)),
        "# Train shapes:",
        *[f"#   {s}" for s in report["train_shapes"]],
        "# Held-out shapes (never fitted on):",
        *[f"#   {s}" for s in report["held_out_shapes"]],
        f"# Held-out time MAPE {_fmt(held['after']['mape_pct'])} (max "
        f"{_fmt(held['after']['max_pct'])}) over {held['after']['n']} records; before "
        f"calibration {_fmt(held['before']['mape_pct'])}.",
    ]
    return "\n".join(header + lines) + "\n"


def loop_facts_line(filled: dict | None, as_recorded: bool = False) -> list[str]:
    """The header's line on loop facts filled from tilesim's table of compiles (``tilesim
    calibrate`` by default) or a compile here (``--fill-loop-facts``), or taken as the
    records carry them (``--as-recorded``), with the reconcile that predicts as the fit
    did; none where the table filled nothing."""
    if as_recorded:
        return ["# Loop facts: as the records carry them (--as-recorded); reconcile with "
                "--as-recorded to predict as the fit did."]
    if filled is None:
        return []
    from validation.fill_facts import sources_phrase

    device = ", ".join(filled["device"]) or "none"
    source = sources_phrase(
        filled, f"tilesim's table of compiles (Triton {filled.get('table_triton')}, the "
                "device's)", f"a compile with Triton {filled['here']} (the device ran {device})")
    same = ("tilesim reconcile takes the same by default" if filled["table"] == filled["records"]
            else "reconcile with --fill-loop-facts to predict as the fit did")
    return [f"# Loop facts: {filled['records']} records took their kernels' main-loop facts "
            f"from {source}; {same}."]


def _filters(report: dict) -> str:
    """What left training records out of the fit, as the preset's header says it."""
    out = ""
    if report.get("train_max_seq") is not None:
        out += f"; training shapes up to N = {report['train_max_seq']}"
    if report.get("max_train_records") is not None:
        out += f"; at most {report['max_train_records']} training records"
    if report.get("unused_train_shapes"):
        out += f"; {len(report['unused_train_shapes'])} training shapes left out"
    if report.get("refused"):
        out += f"; {len(report['refused'])} records the model refuses left out"
    return out


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.1f}%"


def record_sources(paths: list[str]) -> list[str]:
    """``file (sha256 prefix, n lines)`` for each records file the fit read."""
    out = []
    for path in paths:
        data = Path(path).read_bytes()
        lines = data.count(b"\n")
        out.append(f"{path} (sha256:{hashlib.sha256(data).hexdigest()[:16]}, {lines} lines)")
    return out
