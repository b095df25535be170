"""Human-readable rendering of predictions (rich tables), shared by the subcommands."""

from __future__ import annotations


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6),
                        ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def fmt_count(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6),
                        ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f}"


def fmt_time(s: float | None, micro: str = "us", micro_digits: int = 2) -> str:
    """Seconds in s, ms or microseconds (``micro``: "us" in plain text, "µs" on a page)."""
    if s is None:
        return "-"
    if s >= 1e6:  # a what-if with absurd rates: keep the cell narrow
        return f"{s:.3g} s"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.{micro_digits}f} {micro}"


def _resources(pred: dict) -> str:
    """Where the kernels' registers and shared memory came from, in a few words."""
    kinds = {k.get("resources", "estimated") for k in pred["kernels"]}
    if kinds == {"compiled"}:
        return "compiled registers and shared memory"
    if kinds == {"table"}:
        return "registers and shared memory from tilesim's table of compiles"
    if kinds == {"estimated"}:
        return "estimated registers"
    return "registers and shared memory " + ", ".join(sorted(kinds)) + " by kernel"


def counts_tables(pred: dict) -> list:
    """Tables for the counts of a prediction: per kernel, per tensor, summary."""
    from rich.table import Table

    title = (f"{pred['schedule']} on {pred['hardware']}: "
             f"{_problem_line(pred['problem'])}, {_tiling_line(pred['tiling'])}")
    kernels = Table(title=title, title_justify="left")
    timed = pred.get("time_s") is not None
    columns = ["kernel", "grid", "global read", "global write"]
    columns += ["DRAM read", "DRAM write"] if timed else []
    columns += ["tensor FLOPs", "exps", "SRAM/CTA", "CTAs/SM", "legal"]
    columns += ["time"] if timed else []
    for col in columns:
        kernels.add_column(col, justify="left" if col == "kernel" else "right",
                           no_wrap=col == "kernel")
    for k in pred["kernels"]:
        row = [k["name"], f"{k['grid']:,}", fmt_bytes(k["bytes"]["global_read"]),
               fmt_bytes(k["bytes"]["global_write"])]
        if timed:
            row += [fmt_bytes(k["bytes"].get("dram_read")),
                    fmt_bytes(k["bytes"].get("dram_write"))]
        row += [fmt_count(k["flops"]["tensor"]), fmt_count(k["flops"]["exp"]),
                fmt_bytes(k["sram_bytes_per_cta"]), str(k["ctas_per_sm"]),
                "yes" if k["legal"] else "[red]NO[/red]"]
        if timed:
            row.append(fmt_time(k.get("time_s")))
        kernels.add_row(*row)
    tensors = Table(title="bytes per tensor", title_justify="left")
    for col in ("tensor", "global read", "global write", "DRAM read", "DRAM write"):
        tensors.add_column(col, justify="left" if col == "tensor" else "right")
    for name, t in pred["per_tensor"].items():
        if t["global_read"] or t["global_write"]:
            tensors.add_row(name, fmt_bytes(t["global_read"]), fmt_bytes(t["global_write"]),
                            fmt_bytes(t.get("dram_read")), fmt_bytes(t.get("dram_write")))
    b, f = pred["bytes"], pred["flops"]
    summary = Table(show_header=False, title="totals", title_justify="left")
    summary.add_column("what")
    summary.add_column("value", justify="right")
    rows = [
        ("global read / write", f"{fmt_bytes(b['global_read'])} / {fmt_bytes(b['global_write'])}"),
        ("DRAM read / write", f"{fmt_bytes(b['dram_read'])} / {fmt_bytes(b['dram_write'])}"),
        ("SRAM read / write", f"{fmt_bytes(b['smem_read'])} / {fmt_bytes(b['smem_write'])}"),
        ("tensor FLOPs (executed)", fmt_count(f["tensor"])),
        ("FLOPs (paper convention)", fmt_count(f["convention"])),
        ("exps / other FLOPs", f"{fmt_count(f['exp'])} / {fmt_count(f['other'])}"),
        ("arithmetic intensity", f"{pred['arithmetic_intensity']:.1f} FLOP/B (global)"),
        ("SRAM peak per CTA", fmt_bytes(pred["sram_peak_bytes_per_cta"])),
        ("CTAs per SM (main kernel)", f"{pred['ctas_per_sm']} ({_resources(pred)})"),
        ("device memory (all tensors)", fmt_bytes(pred["device_memory_bytes"])),
        ("legal on this GPU", _legal(pred)),
    ]
    spilling = [k for k in pred["kernels"] if k.get("spill_bytes_per_iteration")]
    if spilling:  # known from a compile only: why such a tiling is slow
        rows.insert(-2, ("spills (compiled)", "; ".join(
            f"{k['name']}: {k['registers_per_thread']} registers, "
            f"{k['spill_bytes_per_iteration']} B a thread each iteration" for k in spilling)))
    if b.get("local_read") or b.get("local_write"):  # simulator.spills: beyond L1
        rows.insert(1, ("spills through L2 read / write",
                        f"{fmt_bytes(b['local_read'])} / {fmt_bytes(b['local_write'])}"))
    issued = f.get("issued", {}).get("tensor")
    if issued is not None and issued > f["tensor"]:
        padding = 1 - f["tensor"] / issued
        rows.insert(4, ("tensor FLOPs issued (incl. padding)",
                        f"{fmt_count(issued)} ({100 * padding:.0f}% padding)"))
    if pred.get("time_s") is not None:
        rows.append(("time", fmt_time(pred["time_s"])))
        rows.append(("bound", str(pred.get("bound"))))
    for row in rows:
        summary.add_row(*row)
    d = pred["problem"]["head_dim"]
    if d & (d - 1):
        kernels.caption = (f"head_dim {d} is modelled as is; the Triton kernels (kernels/) "
                           f"take powers of two only, and would run it padded to "
                           f"{1 << (d - 1).bit_length()}")
    return [kernels, tensors, summary]


def _legal(pred: dict) -> str:
    if pred["legal"]:
        return "yes"
    if not pred["fits_device_memory"]:
        return "[red]NO: the tensors do not fit in device memory[/red]"
    return "[red]NO: a CTA does not fit[/red]"


def _problem_line(p: dict) -> str:
    kv = f"/{p['kv_heads']}kv" if p["kv_heads"] != p["heads"] else ""
    n = str(p["seq_q"]) if p["seq_q"] == p["seq_kv"] else f"{p['seq_q']}x{p['seq_kv']}"
    return (f"B={p['batch']} H={p['heads']}{kv} N={n} d={p['head_dim']} {p['dtype']}"
            f"{' causal' if p['causal'] else ''} {p['pass']}")


def _tiling_line(t: dict) -> str:
    s = f"BM={t['block_m']} BN={t['block_n']} stages={t['num_stages']} warps={t['num_warps']}"
    return s + (f" split={t['split_kv']}" if t["split_kv"] > 1 else "")


def print_tables(tables: list) -> None:
    from simulator.cli.common import output_console

    console = output_console()
    for table in tables:
        console.print(table)


def spill_notes(preds: dict) -> list[str]:
    """One line per kernel whose compile spills in its main loop, of each schedule
    (``preds``: schedule name -> prediction; ``simulate`` and ``compare`` print them): a
    command's tiling, the default included, is not always one the kernel fits in
    registers, and a reader should know the bytes and the time come from it, not from
    the algorithm."""
    lines = []
    for name, pred in preds.items():
        spilling = [k for k in pred["kernels"] if k.get("spill_bytes_per_iteration")]
        for k in spilling:
            registers = k.get("registers_per_thread")
            compiled = (f"compiles to {registers} registers a thread and " if registers
                        else "")
            lines.append(
                f"{name}: {k['name']} at this tiling {compiled}spills "
                f"{k['spill_bytes_per_iteration']} bytes a thread every iteration (the "
                f"spills rows); other warps or blocks may not (tilesim sweep --schedule "
                f"{name} ranks the tilings)")
    return lines
