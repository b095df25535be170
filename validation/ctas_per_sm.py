"""The overheads probe's CTAs-per-SM sweep: a kernel's loop iteration, alone and shared.

The model times a CTA's loop iteration twice (``simulator.sim.compute``): ``busy``, what
it takes from its SM's units (tensor cores, exp unit, ALUs, shared memory), and ``path``,
how long it takes its CTA alone (that, plus the load latency the loop's pipeline leaves
exposed, ``simulator.sim.costs``); ``R`` resident CTAs overlap their paths until the
units are busy. On the H200 records the kernels the model times worst fit neither: FA2
backward's dK/dV at 16 x 64 with wgmma took 1350-1610 cycles per CTA and iteration with
4 CTAs per SM at d = 64 and 1450-1860 with 2 at d = 128, where the model has 254 and 413
cycles of path plus one load latency (Nsight Compute's stall reasons,
``validation/records/raw/h200-stalls-2026-11-30``: the warps wait on loads, on barriers
and on the matmuls); naive attention's softmax at N = 16k with the causal mask took 2.1
times its time without it with 4 warps (203 registers against 158: 2 CTAs per SM against
3) and 1.47 times with 8 warps at the same occupancy, where the model sees the same bytes.

This sweep measures the two quantities apart: each kernel alone, on a problem sized so
that its grid is exactly ``c x 132`` CTAs (one wave of ``c`` CTAs on every SM of an H200
or H100; ``SMS``), for ``c`` from 1 up to what fits. ``t(c) / iterations`` is the time of
one CTA's iteration beside ``c - 1`` others: at ``c = 1`` its critical path alone, and as
``c`` grows either flat (latency-bound: the others hide in its waits) or growing like
``c`` (the SM's units are the limit). naive_softmax has no loop: its one wave of one-row
CTAs takes a CTA's life, plus what any kernel costs (the probe's ``empty`` call). A second
wave would not keep ``c`` CTAs on an SM (the GPU fills it to what fits), so there is none.
Every call is timed warm (no flush): the loops' inputs stay in L2, as the records'
re-read tiles mostly do; so do the softmax's rows (4.3 and 8.7 MB), which in the records
came from HBM, so its CTA life here is its compute and L2's, the part the mask changes.

The configs are tilings of the default matrix's records; ``detail["sweep"]`` carries the
problem, tiling and kernel, so that the simulator can predict the same launch.
"""

from __future__ import annotations

from dataclasses import dataclass

SMS = 132  # the H200's (and H100 SXM5's) SMs: the grid is c x SMS CTAs
# The FA kernels' grids are 66 blocks x 2c heads, never one head: Triton compiles a
# kernel again for an integer argument of 1 (and for one divisible by 16, as the records'
# 16 heads are), so 2, 4 and 8 heads share one compile on the device.
SOFTMAX_ROW = 16384  # naive_softmax's row (Nkv) in the records it explains


@dataclass(frozen=True)
class SweepConfig:
    """One kernel and tiling, swept over ``ctas_per_sm``."""

    kernel: str  # fa2_bwd_dkdv, fa2_bwd_dq, fa2_fwd or naive_softmax
    head_dim: int
    block_m: int
    block_n: int
    num_stages: int
    num_warps: int
    causal: bool
    ctas_per_sm: tuple[int, ...]  # at most the CTAs the records' compile fits on an SM
    why: str


# Each ``why``: the kernel's time error on the records (predicted against Nsight Compute's
# duration, the device's loop facts; tilesim reconcile's per-kernel table). CTAs per SM fit:
# the records' compiled registers and shared memory (kernel_facts; a test checks it).
SWEEP = (
    SweepConfig("fa2_bwd_dkdv", 64, 16, 64, 2, 4, False, (1, 2, 4),
                "wgmma, one warpgroup: -28..-37% (causal -51..-55%)"),
    SweepConfig("fa2_bwd_dkdv", 128, 16, 64, 2, 4, False, (1, 2),
                "wgmma, one warpgroup: -43..-55%"),
    SweepConfig("fa2_bwd_dkdv", 64, 64, 64, 2, 4, False, (1, 2),
                "wgmma, one warpgroup: -14..-30%"),
    SweepConfig("fa2_bwd_dkdv", 64, 128, 64, 2, 8, False, (1,),
                "wgmma, two warpgroups: -10..-19%"),
    SweepConfig("fa2_bwd_dkdv", 64, 32, 32, 2, 4, False, (1, 2, 4),
                "mma.sync, the control: -0..+3%"),
    SweepConfig("fa2_bwd_dq", 64, 32, 32, 2, 4, False, (1, 2),
                "mma.sync: +10..+13%"),
    SweepConfig("fa2_bwd_dq", 64, 64, 64, 2, 4, False, (1, 2),
                "wgmma, one warpgroup: +2..+33%"),
    SweepConfig("fa2_fwd", 64, 128, 64, 3, 8, False, (1, 2),
                "wgmma, two warpgroups: +4..+22%"),
    SweepConfig("fa2_fwd", 128, 128, 32, 3, 4, False, (1, 2),
                "wgmma, one warpgroup: -6..-17%"),
    SweepConfig("naive_softmax", 64, 64, 64, 2, 4, False, (1, 2),
                "its row in registers (158 at 16k), the control: -1..+7%"),
    SweepConfig("naive_softmax", 64, 64, 64, 2, 4, True, (1, 2),
                "with the causal mask (203 registers): -52% at 16k"),
    SweepConfig("naive_softmax", 128, 64, 128, 2, 8, True, (1, 2),
                "eight warps, 125 registers: -30% at 16k, its time 1.47x the unmasked"),
)


def call_name(cfg: SweepConfig, ctas_per_sm: int) -> str:
    tag = {"fa2_bwd_dkdv": "dkdv", "fa2_bwd_dq": "dq", "fa2_fwd": "fwd",
           "naive_softmax": "softmax"}[cfg.kernel]
    return (f"sms_{tag}_d{cfg.head_dim}_m{cfg.block_m}_n{cfg.block_n}_s{cfg.num_stages}"
            f"_w{cfg.num_warps}{'_causal' if cfg.causal else ''}_c{ctas_per_sm}")


def sweep_detail(cfg: SweepConfig, ctas_per_sm: int) -> dict:
    """What the call runs, as the records write a config: schedule, problem (its
    ``pass_``), tiling and kernel; ``ctas_per_sm`` and the CTAs' ``iterations`` (loop
    iterations each; 1 for naive_softmax, which has no loop)."""
    c, bm, bn = ctas_per_sm, cfg.block_m, cfg.block_n
    if cfg.kernel == "naive_softmax":
        seq_q, seq_kv, heads, schedule = SMS * c, SOFTMAX_ROW, 1, "naive"
        iterations = 1
    elif cfg.kernel == "fa2_bwd_dkdv":  # one CTA per K/V block: Nkv / bn = SMS / 2
        seq_q = seq_kv = SMS // 2 * bn
        heads, schedule, iterations = 2 * c, "fa2", seq_q // bm
    else:  # fa2_fwd, fa2_bwd_dq: one CTA per Q block, Nq / bm = SMS / 2
        seq_q = seq_kv = SMS // 2 * bm
        heads, schedule, iterations = 2 * c, "fa2", seq_kv // bn
    return {"schedule": schedule, "kernel": cfg.kernel, "ctas_per_sm": c,
            "iterations": iterations, "why": cfg.why,
            "problem": {"batch": 1, "heads": heads, "kv_heads": heads, "seq_q": seq_q,
                        "seq_kv": seq_kv, "head_dim": cfg.head_dim, "dtype": "bf16",
                        "causal": cfg.causal,
                        "pass_": "fwd" if cfg.kernel in ("fa2_fwd", "naive_softmax")
                        else "bwd"},
            "tiling": {"block_m": bm, "block_n": bn, "num_stages": cfg.num_stages,
                       "num_warps": cfg.num_warps, "split_kv": 1}}


def dry_problem(detail: dict) -> dict:
    """The interpreter's stand-in: the same kernel and tiling on a few tiles."""
    t = detail["tiling"]
    if detail["kernel"] == "naive_softmax":
        rows, row = 4, 64
    else:
        rows = row = 2 * max(t["block_m"], t["block_n"])
    return dict(detail["problem"], heads=1, kv_heads=1, seq_q=rows, seq_kv=row, head_dim=64)


def build(detail: dict):
    """The builder of the call that launches ``detail``'s kernel alone: (device, dry_run)
    -> a function of no arguments. What the kernel reads is computed once, here: the
    forward's O and LSE and the preprocess's delta for the backward's kernels, random
    scores for the softmax."""
    def builder(device, dry_run):
        import torch

        from traces.problem import AttentionProblem
        from traces.tiling import Tiling
        from validation.workloads import make_inputs, setup_backward

        problem = dry_problem(detail) if dry_run else detail["problem"]
        p, tiling = AttentionProblem(**problem), Tiling(**detail["tiling"])
        if detail["kernel"] == "naive_softmax":
            from kernels.naive import naive_softmax
            from traces.schedules.base import pow2_at_least

            gen = torch.Generator(device=device).manual_seed(0)
            shape = (p.batch * p.heads, p.seq_q, p.seq_kv)
            s = torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)
            out = torch.empty_like(s)
            grid = (p.seq_q, p.batch * p.heads)
            opts = {"num_warps": tiling.num_warps, "num_stages": tiling.num_stages}
            return lambda: naive_softmax[grid](s, out, p.seq_q, p.seq_kv, CAUSAL=p.causal,
                                               ROW=pow2_at_least(p.seq_kv, 16), **opts)
        inputs = make_inputs(p, device)
        if detail["kernel"] == "fa2_fwd":
            from kernels.fa2 import forward

            return lambda: forward(inputs.q, inputs.k, inputs.v, p.causal, tiling,
                                   inputs.sm_scale)
        from kernels.fa2 import backward_launches

        setup_backward("fa2", p, inputs)
        saved = inputs.saved
        preprocess, dkdv, dq, _ = backward_launches(
            inputs.do, inputs.q, inputs.k, inputs.v, saved["o"], saved["lse"], p.causal,
            tiling, inputs.sm_scale)
        preprocess()
        return dkdv if detail["kernel"] == "fa2_bwd_dkdv" else dq
    return builder


def specs() -> list[tuple[str, dict]]:
    """Every call of the sweep: (name, detail), in the order they run."""
    return [(call_name(cfg, c), sweep_detail(cfg, c)) for cfg in SWEEP for c in cfg.ctas_per_sm]


def per_iteration(entry_us: dict, detail: dict) -> dict:
    """A swept call's warm median as a CTA's iteration (or a softmax CTA's life), in ns:
    ``per_cta`` (``t / iterations``) and ``per_sm`` (that over the CTAs sharing the SM)."""
    t = entry_us.get("warm")
    if t is None:
        return {}
    per_cta = t * 1e3 / detail["iterations"]
    return {"per_cta_ns": per_cta, "per_sm_ns": per_cta / detail["ctas_per_sm"]}


def matching_record(detail: dict, records: list[dict]) -> dict | None:
    """A Triton record of the same kernel, tiling, head dim and mask (and, for the
    softmax, row): its ``kernel_facts`` are the device compile's for the swept kernel."""
    p = detail["problem"]
    for r in records:
        if (r.get("implementation") == "triton" and detail["kernel"] in r.get("kernels", ())
                and r["tiling"] == detail["tiling"]
                and r["problem"]["head_dim"] == p["head_dim"]
                and r["problem"]["causal"] == p["causal"]
                and (detail["kernel"] != "naive_softmax"
                     or r["problem"]["seq_kv"] == p["seq_kv"])):
            return r
    return None


def compare(measured_ns: dict[str, float], records: list[dict], hw,
            details: dict[str, dict] | None = None) -> list[dict]:
    """Per swept call (``details``: name -> detail; default every call of the sweep): the
    model's time of the same kernel launch (its kernel time, which holds the preset's
    launch overhead as the call's warm time holds one launch), with the registers and
    shared memory of a matching record's compile, as a CTA's iteration; beside it the
    measured one where ``measured_ns`` (name -> ns per CTA iteration) has it, and the
    error."""
    from traces.problem import AttentionProblem
    from traces.tiling import Tiling
    from validation.predict import compiled_resources, predict

    out = []
    for name, detail in (details if details is not None else dict(specs())).items():
        rec = matching_record(detail, records)
        pred = predict(AttentionProblem(**detail["problem"]), Tiling(**detail["tiling"]),
                       detail["schedule"], hw,
                       compiled=compiled_resources(rec, hw) if rec else None)
        (kernel,) = [k for k in pred["kernels"] if k["name"] == detail["kernel"]]
        predicted = kernel["time_s"] * 1e9 / detail["iterations"]
        measured = measured_ns.get(name)
        out.append({"call": name, "ctas_per_sm": detail["ctas_per_sm"],
                    "measured_per_cta_ns": measured, "predicted_per_cta_ns": predicted,
                    "error_pct": None if measured is None
                    else 100.0 * (predicted / measured - 1.0),
                    "compiled_from": rec["record_id"] if rec else None})
    return out
