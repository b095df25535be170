"""The HTML report: one self-contained page with every explainer's numbers drawn as plots.

``build`` gathers the JSON of every section — the roofline, naive against FA2, a tile sweep,
the timeline of the best tiling, the N² bill, the online-softmax ledger and, when records are
given, predicted against measured — from the same functions the subcommands print with
``--json``; ``html`` lays them out (``report_sections``), and ``write`` saves the page
atomically. The page embeds that JSON in ``<script type="application/json"
id="tilesim-data">`` and shows key numbers as ``<span data-key="a.b.0.c">``, the key being
the path of the value in that JSON, so a test can read the page's numbers back exactly.

The CPU race is not in the report: it times the machine generating the page, so the page
would change on every run. ``tilesim race`` shows it.
"""

from __future__ import annotations

import math
from pathlib import Path

from simulator.explain import bill, ledger, model, roofline
from simulator.hardware import Hardware
from simulator.prediction import tool_version
from traces.problem import AttentionProblem
from traces.tiling import Tiling

SCHEMA = "tilesim.report/1"
BILL_SEQS = (512, 2048, 8192, 32768)
LEDGER_ARGS = {"seq": 64, "tile": 16, "seed": 0}


def schedule_summary(pred: dict) -> dict:
    """What the side-by-side shows for one schedule, from its prediction (one that was only
    counted, ``model.predict_pair``'s naive when it does not fit, has no time or DRAM bytes
    and keeps its ``note``)."""
    convention = pred["flops"]["convention"]
    timed = model.timed(pred)
    return {
        "time_s": pred["time_s"],
        "bound": pred["bound"],
        "note": pred.get("note"),
        "tflops_per_s": convention / pred["time_s"] / 1e12 if pred["time_s"] else None,
        "bytes": dict(pred["bytes"]),
        "dram_bytes": model.dram_bytes(pred["bytes"]) if timed else None,
        "global_bytes": pred["bytes"]["global_read"] + pred["bytes"]["global_write"],
        "flops": dict(pred["flops"]),
        "hbm_footprint_bytes": pred["device_memory_bytes"],
        "sram_peak_bytes_per_cta": pred["sram_peak_bytes_per_cta"],
        "ctas_per_sm": pred["ctas_per_sm"],
        "legal": pred["legal"],
        "kernels": [{"name": k["name"], "grid": k["grid"], "time_s": k["time_s"],
                     "bound": k.get("bound"),
                     "dram_bytes": model.dram_bytes(k["bytes"]) if timed else None}
                    for k in pred["kernels"]],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def build(problem: AttentionProblem, tiling: Tiling, hw: Hardware, records: dict | None = None,
          sweep_blocks: tuple[int, ...] = model.SWEEP_BLOCKS) -> dict:
    """The JSON of every section of the report (see the module docstring). Kernels in
    tilesim's table of compiles take their resources from it, as the subcommands do
    (``simulator.cli.resources_args.table_compiled``)."""
    from simulator.cli.resources_args import table_compiled, table_compiled_pair

    def fa2_compiled(t):
        return table_compiled(problem, t, "fa2", hw)

    preds = model.predict_pair(problem, tiling, hw, table_compiled_pair(problem, tiling, hw))
    compare = {name: schedule_summary(pred) for name, pred in preds.items()}
    naive, fa2 = compare["naive"], compare["fa2"]
    compare["speedup"] = _ratio(naive["time_s"], fa2["time_s"])
    compare["dram_ratio"] = _ratio(naive["dram_bytes"], fa2["dram_bytes"])
    compare["footprint_ratio"] = _ratio(naive["hbm_footprint_bytes"], fa2["hbm_footprint_bytes"])

    sweep = model.sweep(problem, tiling, "fa2", hw, sweep_blocks, sweep_blocks, fa2_compiled)
    best = sweep["best"]
    best_tiling = tiling if best is None else Tiling(
        block_m=best["block_m"], block_n=best["block_n"], num_stages=tiling.num_stages,
        num_warps=tiling.num_warps)
    seqs = sorted(set(BILL_SEQS) | {problem.seq_kv})
    return jsonable({
        "schema": SCHEMA,
        "tool_version": tool_version(),
        "problem": problem.to_dict(),
        "problem_text": problem.describe(),
        "tiling": tiling.to_dict(),
        "hardware": {"name": hw.name, "display_name": hw.display_name,
                     "sm_count": hw.sm_count, "hbm_bytes": hw.hbm_bytes},
        "model": model.source(),
        "predictions": preds,
        "roofline": roofline.roofline(problem, tiling, hw, preds=preds),
        "compare": compare,
        "sweep": sweep,
        "timeline": model.timeline(problem, best_tiling, "fa2", hw,
                                   fa2_compiled(best_tiling)),
        "bill": bill.bill(seqs, head_dim=problem.head_dim, dtype=problem.dtype),
        "ledger": ledger.ledger(**LEDGER_ARGS),
        "records": records,
    })


def jsonable(value):
    """``value`` as plain JSON types: numpy scalars and arrays unwrapped, NaN and inf as None
    (the page's data must parse as strict JSON, and its spans show the same values)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar or array
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def html(data: dict) -> str:
    from simulator.explain import report_sections

    return report_sections.page_html(data)


def write(data: dict, path: str | Path) -> None:
    """Write the page to ``path`` atomically (temporary file in the same folder, rename)."""
    from simulator.cli.common import write_atomically

    text = html(data)

    def save(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o644)  # a page to share, not the private mode of a temporary file

    write_atomically(path, save)
