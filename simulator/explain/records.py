"""Predicted against measured, for the report: rows and a summary from ``tilesim reconcile``.

``validation.reconcile`` owns the comparison of measurement records with the model; the
report's command line runs it with the report's own predictor (``simulator.explain.model``,
so the page shows one model throughout) and ``from_reconcile`` keeps what the page draws:
one row per timed Triton record — predicted and measured time and DRAM bytes with the
signed error relative to the measurement — the MAPE and max error of each, the per-shape
rank correlation and regret, and the records it did not compare (PyTorch peers, records
the model refuses, records not timed).
"""

from __future__ import annotations

SCHEMA = "tilesim.report-records/1"


def _err(pred: float | None, meas: float | None) -> float | None:
    return (pred - meas) / meas if pred is not None and meas else None


def summarise(rows: list[dict], key: str) -> dict:
    """MAPE and max absolute error (fractions) of ``rows[key]``, over rows that have one."""
    errs = [abs(r[key]) for r in rows if r.get(key) is not None]
    return {"n": len(errs), "mape": sum(errs) / len(errs) if errs else None,
            "max_abs": max(errs) if errs else None}


def _tiling(t: dict | None) -> str:
    return f" BM={t['block_m']} BN={t['block_n']} st={t['num_stages']}" if t else ""


def from_reconcile(result: dict) -> dict:
    """The report's records section from a ``tilesim.reconcile/1`` dict."""
    rows = []
    for r in result["rows"]:
        pred, meas = r["predicted"], r["measured"]
        rows.append({
            "label": f"{r['shape']}{_tiling(r.get('tiling'))}",
            "record_id": r["record_id"], "schedule": r["group"].split()[0],
            "hardware": r["hardware"], "bound": r.get("bound"),
            "predicted_time_s": pred["time"], "measured_time_s": meas["time"],
            "time_err": _err(pred["time"], meas["time"]),
            "predicted_dram_bytes": pred["dram"], "measured_dram_bytes": meas["dram"],
            "dram_err": _err(pred["dram"], meas["dram"]),
        })
    skipped = [{"label": p["shape"], "reason": f"PyTorch peer ({p['implementation']}), "
                                              "measured only"} for p in result["peers"]]
    skipped += [{"label": f"record {u['record_id']}", "reason": f"not predicted: {u['reason']}"}
                for u in result.get("unpredicted", [])]
    if result.get("untimed_records"):
        skipped.append({"label": f"{result['untimed_records']} record(s)",
                        "reason": "not timed (failed or incorrect on the GPU)"})
    summary = result["summary"]
    return {
        "schema": SCHEMA,
        "source": f"tilesim reconcile, model {result['model']}",
        "synthetic": result["synthetic"],
        "hardware": result["hardware"],
        "rows": rows,
        "skipped": skipped,
        "summary": {"time": summarise(rows, "time_err"), "dram": summarise(rows, "dram_err"),
                    "spearman_min": summary.get("spearman_min"),
                    "regret_max_pct": summary.get("regret_max_pct")},
        "shapes": result["shapes"],
    }
