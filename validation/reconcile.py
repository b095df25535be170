"""Reconciliation: predict every measured config and compare with what the GPU did.

For each Triton record that was timed, the model predicts the same (problem, tiling,
schedule) on the preset of the GPU the record names (``--hardware`` overrides). Compared:

- time: predicted ``time_s`` vs the measured median;
- DRAM bytes: predicted ``dram_read + dram_write`` vs ncu's ``dram__bytes_{read,write}``
  (a kernel that re-reads what an earlier one stored is taken as ncu profiles it, L2
  invalidated first: its ``profiled`` bytes, ``simulator.sim.predict_as_timed``);
- L2 bytes: predicted global traffic (what the SMs request) vs ncu's L2 sectors from the
  SMs (``lts__t_sectors_srcunit_tex_op_{read,write}``) x 32 bytes.

Summary, per schedule and pass and overall: MAPE and max error of each; per shape (same
problem, different tilings): Spearman rank correlation of predicted and measured times, and
the regret of the predicted-best tiling, and its *ties*: the tilings predicted within 2% of
that best, with how far apart they measured (a tie measured further apart than the regret
target says the model misses what tells them apart). Peers (PyTorch SDPA) are listed, not
predicted.

Per kernel, where ncu profiled a record's kernels and they are the prediction's kernels (by
name and order), each kernel's time and DRAM bytes against ncu's (``validation.per_kernel``):
that is where a schedule of several kernels (naive attention, the backward) shows which
kernel the model gets wrong, and a mechanism it leaves out shows as the tilings it hits.
The measured time minus the kernels' ncu durations, per kernel launch, is what launching
costs on the GPU (the launch latency and the gaps between kernels): its median over the
records is reported beside the preset's ``kernel_launch_overhead_s``, an assumption that
measurement can replace.

Each record's timing spread (do_bench's p80 - p20 over the median) says how well the
measurement itself pins the time; a record above ``UNSTABLE_SPREAD_PCT`` is listed as
unstable, with the time error and the ranking of tilings without such records beside the
headline (which keeps them): a tiling timed inconsistently can decide a shape's regret.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict

from simulator.hardware import load_hardware
from simulator.prediction import l2_bytes
from traces.problem import ProblemError
from validation import predict as predict_mod
from validation import stats
from validation.choose import MIN_GAP
from validation.per_kernel import (
    KERNEL_METRICS,
    as_profiled,
    by_kernel_and_tiling,
    clock_summary,
    dram_bytes,
    errors_pct,
    kernel_rows,
    launch_gap_s,
    left_dirty_summary,
    median_gap_per_group,
    sum_or_none,
)
from validation.records import (
    UNSTABLE_SPREAD_PCT,
    group_key,
    latest_per_config,
    shape_key,
    spread_pct,
)

REPORT_SCHEMA = "tilesim.reconcile/1"
# GPU names as torch / nvidia-smi report them -> preset.
GPU_PRESETS = ((r"H200", "h200-sxm"), (r"H100", "h100-sxm5"),
               (r"A100.*80\s*GB", "a100-sxm4-80gb"), (r"A100", "a100-sxm4-40gb"),
               (r"RTX 4090", "rtx-4090"))
# The targets on real H200 records.
TARGETS = {"time_mape_pct": 10.0, "time_max_pct": 20.0, "dram_mape_pct": 5.0,
           "spearman_min": 0.9, "regret_max_pct": 5.0}
# Tilings the model rates within this of the predicted best are its "ties": the plans'
# threshold for "rated differently".
TIE_GAP = MIN_GAP
METRICS = ("time", "dram", "l2")


def preset_for(gpu_name: str | None) -> str | None:
    for pattern, preset in GPU_PRESETS:
        if gpu_name and re.search(pattern, gpu_name):
            return preset
    return None


def _measured(rec: dict) -> dict:
    c = rec.get("counters") or {}
    return {"time": rec["timing"]["median_s"],
            "dram": sum_or_none(c.get("dram_read_bytes"), c.get("dram_write_bytes")) if c else None,
            "l2": sum_or_none(c.get("l2_read_bytes"), c.get("l2_write_bytes")) if c else None}


def timing_spread(rows: list[dict]) -> dict:
    """The records' timing spread (``spread_pct``): its median, the records above
    ``UNSTABLE_SPREAD_PCT`` (worst first), and the time error and the ranking of tilings
    without them (the headline statistics keep every record)."""
    spreads = [r["spread_pct"] for r in rows if r["spread_pct"] is not None]
    unstable = sorted((r for r in rows if (r["spread_pct"] or 0.0) > UNSTABLE_SPREAD_PCT),
                      key=lambda r: -r["spread_pct"])
    stable = [r for r in rows if (r["spread_pct"] or 0.0) <= UNSTABLE_SPREAD_PCT]
    return {"threshold_pct": UNSTABLE_SPREAD_PCT, "n": len(spreads),
            "median_pct": statistics.median(spreads) if spreads else None,
            "unstable": [{"record_id": r["record_id"], "spread_pct": r["spread_pct"],
                          "time_error_pct": r["error_pct"]["time"]} for r in unstable],
            "time_without_unstable": _summary(stable, ("time",))["time"],
            "ranking_without_unstable": ranking(rank_shapes(stable))}


def rank_shapes(rows: list[dict]) -> list[dict]:
    """Per shape (same problem and GPU, several tilings): Spearman rank correlation of the
    predicted and measured times, the regret of the predicted-best tiling, and its ties
    (``stats.predicted_ties``); None where fewer than two tilings were predicted."""
    by_shape = defaultdict(list)
    for r in rows:
        by_shape[(r["hardware"], r["shape"])].append(r)
    shapes = []
    for (hw_name, shape), rs in by_shape.items():
        timed = [r for r in rs if r["predicted"]["time"] is not None]
        entry = {"shape": shape, "hardware": hw_name, "n_tilings": len(rs),
                 "spearman": None, "regret_pct": None, "best_measured": None,
                 "best_predicted": None, "ties": []}
        best = min(rs, key=lambda r: r["measured"]["time"])
        entry["best_measured"] = best["tiling"]
        if len(timed) >= 2:
            p = [r["predicted"]["time"] for r in timed]
            m = [r["measured"]["time"] for r in timed]
            rho = stats.spearman(p, m)
            entry["spearman"] = None if math.isnan(rho) else rho
            entry["regret_pct"] = stats.regret(p, m)
            entry["best_predicted"] = timed[min(range(len(p)), key=lambda i: p[i])]["tiling"]
            entry["ties"] = [{"tiling": timed[i]["tiling"], "predicted_pct": dp,
                              "measured_pct": dm}
                             for i, dp, dm in stats.predicted_ties(p, m, TIE_GAP)]
        shapes.append(entry)
    return shapes


def ranking(shapes: list[dict]) -> dict:
    """How well the model ranks tilings over ``rank_shapes``' shapes: Spearman's mean,
    median and least, and on how many shapes it reaches its target; the regret's mean and
    most, and on how many shapes it stays within its target."""
    rhos = [s["spearman"] for s in shapes if s["spearman"] is not None]
    regrets = [s["regret_pct"] for s in shapes if s["regret_pct"] is not None]
    return {"n_shapes": len(shapes),
            "spearman_n": len(rhos),
            "spearman_mean": sum(rhos) / len(rhos) if rhos else None,
            "spearman_median": statistics.median(rhos) if rhos else None,
            "spearman_min": min(rhos) if rhos else None,
            "spearman_at_target": sum(r >= TARGETS["spearman_min"] for r in rhos),
            "regret_n": len(regrets),
            "regret_mean_pct": sum(regrets) / len(regrets) if regrets else None,
            "regret_max_pct": max(regrets) if regrets else None,
            "regret_at_target": sum(r <= TARGETS["regret_max_pct"] for r in regrets)}


def _occupancy_from(pred: dict) -> str:
    """``"compiled"`` when every kernel was predicted with the compile's registers and
    shared memory (the record's ``kernel_facts``), ``"estimated"`` when none was (or the
    predictor does not say), else ``"mixed"``."""
    kinds = {k.get("resources", "estimated") for k in pred.get("kernels") or ()}
    return ("compiled" if kinds == {"compiled"}
            else "estimated" if kinds <= {"estimated"} else "mixed")


def _predicted(pred: dict) -> dict:
    """The prediction's time, DRAM and L2 bytes; its DRAM bytes with each kernel's as
    Nsight Compute profiles it where they differ (``profiled``: a kernel re-reading what
    an earlier one stored, which ncu's flush sends back to DRAM), as ncu measured them."""
    b = pred["bytes"]
    dram = sum_or_none(b.get("dram_read"), b.get("dram_write"))
    for k in pred.get("kernels") or ():
        if k.get("profiled") and dram is not None:
            dram += dram_bytes(as_profiled(k)) - dram_bytes(k["bytes"])
    return {"time": pred.get("time_s"), "dram": dram, "l2": l2_bytes(b)}


def _summary(rows: list[dict], metrics: tuple[str, ...] = METRICS) -> dict:
    out = {}
    for m in metrics:
        pairs = [(r["predicted"][m], r["measured"][m]) for r in rows
                 if r["predicted"][m] is not None and r["measured"][m]]
        p, q = [a for a, _ in pairs], [b for _, b in pairs]
        out[m] = {"n": len(pairs), "mape_pct": stats.mape(p, q) if pairs else None,
                  "max_pct": stats.max_abs_error(p, q) if pairs else None}
    return out


def operand_demand(rec: dict) -> float | None:
    """The largest shared-memory operand bytes per FLOP of the record's wgmma instructions,
    as the GPU's own compiler made them (``kernel_facts``, written by the device run); None
    without facts or wgmma."""
    values = [k.get("wgmma_smem_bytes_per_flop_max") for k in rec.get("kernel_facts") or ()]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _operand_limit(hw, dtype: str) -> float | None:
    return hw.smem_operand_limit(dtype) if dtype in hw.tensor_flops_per_s else None


def by_operand_demand(rows: list[dict]) -> dict:
    """Time errors of the records whose wgmma ask more of shared memory than it can feed at
    the tensor peak, against the others (the model leaves those reads out, so the first
    group should be predicted too fast: a negative mean error)."""
    groups = {"over": [], "within": []}
    for r in rows:
        if r["operand_demand"] is not None and r["operand_limit"] is not None:
            groups["over" if r["operand_demand"] > r["operand_limit"] else "within"].append(r)
    out = {}
    for name, rs in groups.items():
        time = _summary(rs, ("time",))["time"]
        errors = [r["error_pct"]["time"] for r in rs if r["error_pct"]["time"] is not None]
        out[name] = {"n": time["n"], "mape_pct": time["mape_pct"],
                     "mean_error_pct": sum(errors) / len(errors) if errors else None}
    return out


def nothing_compared(report: dict) -> str:
    """Why a reconciliation compared no record with the model, in one line."""
    n, why = report["n_records"], ""
    if report["unpredicted"]:
        first = report["unpredicted"][0]
        why = (f"; {len(report['unpredicted'])} the model refuses, the first: "
               f"{first['record_id']}: {first['reason']}")
    if report["untimed_records"]:
        why += f"; {report['untimed_records']} without a timing"
    if report["peers"]:
        why += f"; {len(report['peers'])} of PyTorch's peers (measured, not modelled)"
    return f"none of the {n} records could be compared with the model{why}"


def reconcile(records: list[dict], hardware: str | None = None, predictor=None,
              model: str | None = None, jobs: int = 1,
              fallback_hardware: str | None = None, progress=None) -> dict:
    """The reconciliation report (``tilesim.reconcile/1``) of ``records``.

    Each record is predicted on ``hardware`` if given, else on the preset of the GPU it
    ran on, else (a GPU without a preset) on ``fallback_hardware``, else it is an error.

    ``jobs > 1`` predicts the records in that many processes (``predictor`` must then be a
    module-level function); the report is the same. ``progress(done, total)``, if given,
    hears of each prediction (``map_tasks``).
    """
    predictor = predictor or predict_mod.predict
    model = model or predict_mod.model_name()
    records, duplicates = latest_per_config(records)
    hw_cache: dict[str, object] = {}
    peers, unpredicted, untimed, todo = [], [], 0, []
    for rec in records:
        if rec["timing"] is None:
            untimed += 1
            continue
        if rec["implementation"] != "triton":
            peers.append({"shape": shape_key(dict(rec, schedule=None)),
                          "implementation": rec["implementation"],
                          "problem": rec["problem"], "median_s": rec["timing"]["median_s"],
                          "tflops": rec["timing"].get("tflops")})
            continue
        name = (hardware or preset_for(rec["environment"].get("gpu_name"))
                or fallback_hardware)
        if name is None:
            raise ProblemError(f"record {rec['record_id']}: no preset for GPU "
                               f"{rec['environment'].get('gpu_name')!r}; pass --hardware")
        if name not in hw_cache:
            hw_cache[name] = load_hardware(name)
        todo.append((rec, name, (predictor, rec, hw_cache[name])))
    results = predict_mod.map_tasks(predict_mod.predict_or_refusal,
                                    [task for _, _, task in todo], jobs, progress=progress)
    rows = []
    for (rec, name, _), (pred, refused) in zip(todo, results, strict=True):
        if pred is None:
            unpredicted.append({"record_id": rec["record_id"], "reason": refused})
            continue
        measured, predicted = _measured(rec), _predicted(pred)
        rows.append({"record_id": rec["record_id"], "hardware": name,
                     "group": group_key(rec), "shape": shape_key(rec), "tiling": rec["tiling"],
                     "head_dim": rec["problem"]["head_dim"],
                     "measured": measured, "predicted": predicted,
                     "error_pct": errors_pct(predicted, measured, METRICS),
                     "kernels": kernel_rows(rec, pred, hw_cache[name]),
                     "launch_gap_s": launch_gap_s(rec),
                     "spread_pct": spread_pct(rec),
                     "operand_demand": operand_demand(rec),
                     "operand_limit": _operand_limit(hw_cache[name], rec["problem"]["dtype"]),
                     "bound": pred.get("bound"),
                     "occupancy_from": _occupancy_from(pred),
                     "gpu": rec["environment"].get("gpu_name"),
                     "synthetic": bool(rec.get("synthetic"))})
    _keep_gpus_apart(rows)
    groups, kernels = defaultdict(list), defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
        for k in r["kernels"]:
            kernels[k["name"]].append(k)
    shapes = rank_shapes(rows)
    gaps = [r["launch_gap_s"] for r in rows if r["launch_gap_s"] is not None]
    rank = ranking(shapes)
    ties = [t["measured_pct"] for s in shapes for t in s["ties"]]
    overall = _summary(rows)
    report = {
        "schema": REPORT_SCHEMA, "model": model, "hardware": sorted(hw_cache),
        "synthetic": any(bool(rec.get("synthetic")) for rec in records),
        "n_records": len(records) + duplicates, "duplicates_dropped": duplicates,
        "untimed_records": untimed, "unpredicted": unpredicted, "rows": rows,
        "peers": peers, "shapes": shapes,
        "summary": {
            "overall": overall,
            "per_group": {g: _summary(rs) for g, rs in sorted(groups.items())},
            "per_hardware": {name: _summary([r for r in rows if r["hardware"] == name])
                             for name in sorted(hw_cache)},
            "per_kernel": {k: _summary(ks, KERNEL_METRICS) for k, ks in sorted(kernels.items())},
            "per_kernel_tiling": by_kernel_and_tiling(rows),
            "launch_gap_s": {
                "median": statistics.median(gaps) if gaps else None, "n": len(gaps),
                "per_group": median_gap_per_group(rows),
                "preset": {n: hw_cache[n].kernel_launch_overhead_s for n in sorted(hw_cache)}},
            **{key: rank[key] for key in ("spearman_mean", "spearman_min",
                                          "regret_mean_pct", "regret_max_pct")},
            "ranking": rank,
            "by_operand_demand": by_operand_demand(rows),
            "sm_clock_hz": clock_summary(rows),
            "left_dirty": left_dirty_summary(rows),
            "timing_spread": timing_spread(rows),
            "occupancy_from": {source: sum(r["occupancy_from"] == source for r in rows)
                               for source in ("compiled", "estimated", "mixed")},
            "ties": {"n": len(ties),
                     "max_abs_measured_pct": max(map(abs, ties)) if ties else None,
                     "apart": sum(abs(t) > TARGETS["regret_max_pct"] for t in ties)},
        },
    }
    report["summary"]["targets"] = targets_met(report["summary"])
    return report


def _keep_gpus_apart(rows: list[dict]) -> None:
    """Records of several GPUs: each row's group and shape take its preset's name (or, where
    one preset serves several GPUs, ``--hardware``, the GPU's too), so that a shape's
    tilings are ranked, and a group summarised, within one GPU."""
    gpus = {(r["hardware"], r["gpu"]) for r in rows}
    if len(gpus) < 2:
        return
    one_preset_each = len({hardware for hardware, _ in gpus}) == len(gpus)
    for r in rows:
        tag = r["hardware"] if one_preset_each else f"{r['hardware']} ({r['gpu']})"
        r["group"], r["shape"] = f"{tag} {r['group']}", f"{tag} {r['shape']}"


# What a saved report must hold for ``tilesim reconcile --from-saved`` to show it again.
SAVED_KEYS = ("model", "hardware", "synthetic", "rows", "peers", "shapes", "summary",
              "unpredicted", "duplicates_dropped")


def load_saved_report(path) -> dict:
    """A report ``tilesim reconcile --save`` wrote, read back to be shown again (its tables,
    its targets, its plot) without predicting anything; ``ProblemError`` (one line) for a
    file that is missing, not JSON, or not such a report."""
    import json
    from pathlib import Path

    try:
        report = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ProblemError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProblemError(f"{path} is not JSON: {exc}") from None
    if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise ProblemError(f"{path} is not a saved reconcile report (schema "
                           f"{REPORT_SCHEMA!r} expected, found {found!r})")
    missing = [key for key in SAVED_KEYS if key not in report]
    if missing:
        raise ProblemError(f"{path}: the saved report lacks {', '.join(missing)}")
    if not isinstance(report["rows"], list) or not isinstance(report["summary"], dict):
        raise ProblemError(f"{path}: the saved report's rows or summary are malformed")
    return report


def targets_met(summary: dict) -> dict:
    """Each target of the issue: (value, target, met) — met is None without data."""
    o = summary["overall"]
    values = {"time_mape_pct": o["time"]["mape_pct"], "time_max_pct": o["time"]["max_pct"],
              "dram_mape_pct": o["dram"]["mape_pct"], "spearman_min": summary["spearman_min"],
              "regret_max_pct": summary["regret_max_pct"]}
    out = {}
    for key, target in TARGETS.items():
        v = values[key]
        met = None if v is None else (v >= target if key == "spearman_min" else v <= target)
        out[key] = {"value": v, "target": target, "met": met}
    return out
