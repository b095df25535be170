"""Showing a reconciliation report: rich tables for people, a scatter plot for papers."""

from __future__ import annotations

from pathlib import Path

from simulator.cli.render import fmt_bytes, fmt_time
from validation.reconcile import TARGETS, TIE_GAP
from validation.selection import selection_flags


def _pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f}%" if abs(v) < 1e6 else f"{v:+.2e}%"


def _abs_pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}%" if abs(v) < 1e6 else f"{v:.2e}%"


def _tiling(t: dict) -> str:
    s = f"{t['block_m']}x{t['block_n']} s{t['num_stages']} w{t['num_warps']}"
    return s + (f" split {t['split_kv']}" if t.get("split_kv", 1) > 1 else "")


def tables(report: dict, per_config: bool = True) -> list:
    from rich.table import Table

    out = []
    mark = " [SYNTHETIC records]" if report["synthetic"] else ""
    if per_config:
        t = Table(title=f"predicted ({report['model']}) vs measured, per config{mark}",
                  title_justify="left")
        for col in ("shape", "tiling", "t meas", "spread", "t pred", "err", "DRAM meas",
                    "DRAM pred", "err", "L2 meas", "L2 pred", "err"):
            t.add_column(col, justify="left" if col in ("shape", "tiling") else "right")
        for r in sorted(report["rows"], key=lambda r: (r["shape"], r["measured"]["time"])):
            m, p, e = r["measured"], r["predicted"], r["error_pct"]
            spread = r.get("spread_pct")
            t.add_row(r["shape"], _tiling(r["tiling"]), fmt_time(m["time"]),
                      "-" if spread is None else f"{spread:.1f}%", fmt_time(p["time"]),
                      _pct(e["time"]), fmt_bytes(m["dram"]), fmt_bytes(p["dram"]),
                      _pct(e["dram"]), fmt_bytes(m["l2"]), fmt_bytes(p["l2"]), _pct(e["l2"]))
        out.append(t)
    s = Table(title=f"summary: MAPE / max |error|{mark}", title_justify="left")
    for col in ("group", "n", "time MAPE", "time max", "DRAM MAPE", "DRAM max", "L2 MAPE",
                "L2 max"):
        s.add_column(col, justify="left" if col == "group" else "right")
    summ = report["summary"]
    per_hardware = summ.get("per_hardware") or {}
    overall = [(f"{name} overall", g) for name, g in per_hardware.items()
               ] if len(per_hardware) > 1 else []
    for name, g in [*summ["per_group"].items(), *overall, ("overall", summ["overall"])]:
        s.add_row(name, str(max(g[m]["n"] for m in ("time", "dram", "l2"))),
                  _abs_pct(g["time"]["mape_pct"]), _abs_pct(g["time"]["max_pct"]),
                  _abs_pct(g["dram"]["mape_pct"]), _abs_pct(g["dram"]["max_pct"]),
                  _abs_pct(g["l2"]["mape_pct"]), _abs_pct(g["l2"]["max_pct"]))
    out.append(s)
    per_kernel = summ.get("per_kernel") or {}
    if per_kernel:
        k = Table(title=f"per kernel: ncu duration vs predicted kernel time without the launch "
                        f"overhead{mark}", title_justify="left")
        for col in ("kernel", "n", "time MAPE", "time max", "DRAM MAPE", "DRAM max"):
            k.add_column(col, justify="left" if col == "kernel" else "right")
        for name, g in per_kernel.items():
            k.add_row(name, str(max(g[m]["n"] for m in ("time", "dram"))),
                      _abs_pct(g["time"]["mape_pct"]), _abs_pct(g["time"]["max_pct"]),
                      _abs_pct(g["dram"]["mape_pct"]), _abs_pct(g["dram"]["max_pct"]))
        out.append(k)
    by_tiling = summ.get("per_kernel_tiling") or []
    if per_config and by_tiling:
        k = Table(title=f"per kernel and tiling: signed time error (predicted kernel time vs "
                        f"ncu duration), over the shapes{mark}", title_justify="left")
        for col in ("kernel", "d", "tiling", "n", "mean", "min", "max"):
            k.add_column(col, justify="left" if col in ("kernel", "tiling") else "right")
        for g in by_tiling:
            k.add_row(g["kernel"], str(g["head_dim"]), _tiling(g["tiling"]), str(g["n"]),
                      _pct(g["mean_error_pct"]), _pct(g["min_error_pct"]),
                      _pct(g["max_error_pct"]))
        out.append(k)
    if any(sh["spearman"] is not None for sh in report["shapes"]):
        r = Table(title="tiling ranking per shape", title_justify="left")
        for col in ("shape", "tilings", "Spearman", "regret", "predicted best",
                    "measured best"):
            r.add_column(col, justify="right" if col in ("tilings", "Spearman", "regret")
                         else "left")
        for sh in report["shapes"]:
            r.add_row(sh["shape"], str(sh["n_tilings"]),
                      "-" if sh["spearman"] is None else f"{sh['spearman']:.2f}",
                      _abs_pct(sh["regret_pct"]),
                      _tiling(sh["best_predicted"]) if sh["best_predicted"] else "-",
                      _tiling(sh["best_measured"]))
        out.append(r)
    ties = [(sh, t) for sh in report["shapes"] for t in sh["ties"]]
    if ties:
        tt = Table(title=f"predicted ties: tilings rated within {100 * TIE_GAP:g}% of the "
                         "predicted best", title_justify="left")
        for col in ("shape", "predicted best", "tie", "predicted", "measured"):
            tt.add_column(col, justify="right" if col in ("predicted", "measured") else "left")
        for sh, t in ties:
            tt.add_row(sh["shape"], _tiling(sh["best_predicted"]), _tiling(t["tiling"]),
                       _pct(t["predicted_pct"]), _pct(t["measured_pct"]))
        out.append(tt)
    if report["peers"]:
        p = Table(title="PyTorch SDPA peers (measured)", title_justify="left")
        for col in ("shape", "backend", "time", "TFLOP/s"):
            p.add_column(col, justify="right" if col in ("time", "TFLOP/s") else "left")
        for peer in sorted(report["peers"], key=lambda x: (x["shape"], x["implementation"])):
            p.add_row(peer["shape"], peer["implementation"], fmt_time(peer["median_s"]),
                      "-" if peer["tflops"] is None else f"{peer['tflops']:.1f}")
        out.append(p)
    return out


def selection_line(report: dict) -> str | None:
    """What ``--match``/``--max-seq`` kept, or None for every record: a subset's numbers are
    not the run's headline."""
    sel = report.get("selection")
    if not sel:
        return None
    return (f"selection: {sel['selected']} of {sel['of']} records ({selection_flags(sel)}); "
            "the numbers below are this subset's, not the whole run's")


def _ranking_text(rank: dict) -> str:
    """``reconcile.ranking`` in words: on how many shapes Spearman and the regret meet their
    targets, with the median rho and the mean and largest regret."""
    parts = []
    if rank["spearman_n"]:
        parts.append(f"Spearman >= {TARGETS['spearman_min']:g} on {rank['spearman_at_target']} "
                     f"of {rank['spearman_n']} shapes (median {rank['spearman_median']:.2f})")
    if rank["regret_n"]:
        parts.append(f"regret <= {TARGETS['regret_max_pct']:g}% on {rank['regret_at_target']} "
                     f"of {rank['regret_n']} (mean {_abs_pct(rank['regret_mean_pct'])}, max "
                     f"{_abs_pct(rank['regret_max_pct'])})")
    return ", ".join(parts)


def target_lines(report: dict) -> list[str]:
    selected = selection_line(report)
    lines = [selected] if selected else []
    summ = report["summary"]
    gpus = sorted({str(r.get("gpu")) for r in report.get("rows") or ()})
    if len(gpus) > 1:
        presets = ", ".join(report.get("hardware") or ())
        lines.append(f"note: records of {len(gpus)} GPUs ({', '.join(gpus)}), predicted on "
                     f"{presets}: the targets below pool them (each shape's tilings are "
                     "ranked within one GPU; the summary has a row per preset)")
    for key, t in summ["targets"].items():
        verdict = {None: "no data", True: "met", False: "NOT met"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        lines.append(f"target {key}: {value} (target {t['target']:g}) {verdict}")
    if summ.get("ranking", {}).get("spearman_n") or summ.get("ranking", {}).get("regret_n"):
        lines.append("tiling ranks per shape: " + _ranking_text(summ["ranking"]))
    if report["model"] == "counts":
        lines.append("note: the timing simulator is not available; predicted time and DRAM "
                     "bytes are n/a, global (L2) bytes come from exact counts")
    ties = summ.get("ties") or {}
    if ties.get("n"):
        lines.append(f"predicted ties (tilings rated within {100 * TIE_GAP:g}% of their "
                     f"shape's predicted best): {ties['n']}, of which {ties['apart']} measured "
                     f"more than {TARGETS['regret_max_pct']:g}% apart from it (largest "
                     f"{ties['max_abs_measured_pct']:.1f}%); a tie measured apart is a "
                     "mechanism the model leaves out")
    demand = summ.get("by_operand_demand") or {}
    if demand.get("over", {}).get("n"):
        parts = [f"{label} n={g['n']}, time MAPE {_abs_pct(g['mape_pct'])}, mean error "
                 f"{_pct(g['mean_error_pct'])}" for label, g in
                 (("over the limit:", demand["over"]), ("within:", demand["within"]))]
        lines.append("records by what their wgmma ask of shared memory (left out of the "
                     "model): " + "; ".join(parts))
    spread = summ.get("timing_spread") or {}
    if spread.get("median_pct") is not None:
        unstable, rest = spread["unstable"], spread["time_without_unstable"]
        line = (f"timing spread (p80 - p20 of the timed runs, over their median): median "
                f"{spread['median_pct']:.2f}% over {spread['n']} records; ")
        if unstable:
            line += (f"{len(unstable)} above {spread['threshold_pct']:g}% (timed "
                     f"inconsistently, up to {unstable[0]['spread_pct']:.1f}%: "
                     f"{unstable[0]['record_id']}); without them time MAPE "
                     f"{_abs_pct(rest['mape_pct'])}, max {_abs_pct(rest['max_pct'])}")
            ranked = spread.get("ranking_without_unstable")
            if ranked and (ranked["spearman_n"] or ranked["regret_n"]):
                line += "; " + _ranking_text(ranked)
        else:
            line += f"none above {spread['threshold_pct']:g}%"
        lines.append(line)
    source = summ.get("occupancy_from") or {}
    if any(source.values()):
        lines.append(f"occupancy: {source['compiled']} records predicted with the registers "
                     f"and shared memory of the device's compile (kernel_facts), "
                     f"{source['estimated']} with the model's estimate, {source['mixed']} "
                     "partly")
    filled = report.get("loop_facts_filled")
    if filled is not None:
        lines.append(f"loop facts: {filled} records took their kernels' "
                     "instruction and spill facts (a warp's instructions per main-loop "
                     "iteration, or in all without a loop; spills per iteration, waits for "
                     f"them) from {_fill_sources(report.get('loop_facts_compilers'))}")
    gap = summ.get("launch_gap_s") or {}
    if gap.get("median") is not None:
        assumed = ", ".join(f"{n} {fmt_time(v)}" for n, v in gap["preset"].items())
        groups = ", ".join(f"{g} {fmt_time(v)}" for g, v in (gap.get("per_group") or {}).items())
        lines.append(f"launch cost: measured time minus ncu kernel durations, median "
                     f"{fmt_time(gap['median'])} per kernel over {gap['n']} records "
                     f"(preset kernel_launch_overhead_s: {assumed})"
                     + (f"; per group: {groups}" if groups else ""))
    clocks = summ.get("sm_clock_hz") or {}
    if any(group["n"] for group in clocks.values()):
        parts = []
        for name, label in (("matmul", "kernels with matmuls"), ("other", "the others")):
            g = clocks[name]
            if g["n"]:
                model = "/".join(f"{hz / 1e9:.3f}" for hz in g["model"])
                parts.append(f"{label} median {g['median'] / 1e9:.3f} GHz over {g['n']} "
                             f"({g['min'] / 1e9:.3f}-{g['max'] / 1e9:.3f}; model {model})")
        lines.append("SM clock (ncu): " + ", ".join(parts))
    left = summ.get("left_dirty") or {}
    if left:
        parts = ", ".join(f"{name} {fmt_bytes(v['measured'])} (model {fmt_bytes(v['model'])})"
                          for name, v in left.items())
        lines.append("left dirty in L2 at a kernel's end (its stores less ncu's DRAM writes, "
                     "which leave out what the next flush writes back; median per kernel): "
                     + parts)
    for item in report["unpredicted"]:
        lines.append(f"note: {item['record_id']} not predicted: {item['reason']}")
    if report["duplicates_dropped"]:
        lines.append(f"note: {report['duplicates_dropped']} older duplicate records ignored")
    return lines


def plot(report: dict, path: str | Path) -> None:
    """Predicted vs measured, log-log, with y = x: time (left) and bytes (right)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.explain.common import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    panels = ((axes[0], ("time",), "time (s)"), (axes[1], ("dram", "l2"), "bytes"))
    for ax, metrics, label in panels:
        drawn = []
        for metric in metrics:
            by_group: dict[str, list] = {}
            for r in report["rows"]:
                p, m = r["predicted"][metric], r["measured"][metric]
                if p is not None and m:
                    by_group.setdefault(r["group"], []).append((m, p))
            for group, pts in sorted(by_group.items()):
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=14, alpha=0.8, marker="o" if metric != "l2" else "x",
                           label=f"{group} ({metric.upper()})" if len(metrics) > 1 else group)
                drawn += list(xs) + list(ys)
        if drawn:
            lo, hi = min(drawn) / 1.5, max(drawn) * 1.5
            ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # minor labels of log axes overlap
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no predictions", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
    title = f"tilesim ({report['model']}) vs {', '.join(report['hardware']) or 'GPU'}"
    sel = report.get("selection")
    subset = f" — {sel['selected']} of {sel['of']} records ({selection_flags(sel)})" if sel else ""
    fig.suptitle(title + (" — SYNTHETIC records" if report["synthetic"] else "") + subset)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _fill_sources(compilers: dict | None) -> str:
    """Where ``--fill-loop-facts`` took the facts: tilesim's table of compiles, a compile
    here, or both (``validation.fill_facts.fill_saying_how``)."""
    from validation.fill_facts import sources_phrase

    table = (f"tilesim's table of compiles (Triton {(compilers or {}).get('table_triton')}, "
             "the version the device ran: its facts)")
    return sources_phrase(compilers or {}, table,
                          f"a compile here (--fill-loop-facts: {_compilers(compilers)})")


def _compilers(compilers: dict | None) -> str:
    """Which Triton compiled the filled loop facts, against the records' device's."""
    if not compilers:
        return "Triton here, not necessarily the device's"
    device = ", ".join(compilers["device"]) or "none"
    if compilers["same"]:
        return f"Triton {compilers['here']} here, the version the device ran: its facts"
    return (f"Triton {compilers['here']} here, the device ran {device}: the compiler's facts "
            "in kind, not the device's")

