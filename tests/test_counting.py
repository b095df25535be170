"""Closed-form counts against trace replay (exact), and against the issue's formulas."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.counting import closed_form
from traces.problem import AttentionProblem
from traces.schedules import build_schedule, kernel_traffic
from traces.tiling import Tiling
from traces.trace import Trace, record_counts

BLOCKS = st.sampled_from([16, 32, 64])


@st.composite
def cases(draw):
    schedule = draw(st.sampled_from(["fa2", "fa1", "naive", "decode"]))
    heads = draw(st.sampled_from([1, 2, 4, 6]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 3, 6) if heads % h == 0]))
    bm, bn = draw(BLOCKS), draw(BLOCKS)
    if schedule == "decode":
        seq_q, seq_kv = draw(st.integers(1, 16)), draw(st.integers(1, 300))
        tc = -(-seq_kv // bn)
        split = draw(st.integers(1, tc))
        chunk = -(-tc // split)
        split = -(-tc // chunk)  # a split count that leaves no empty chunk
    else:
        seq_q, seq_kv, split = draw(st.integers(1, 160)), draw(st.integers(1, 160)), 1
    passes = ["fwd", "bwd", "fwd+bwd"] if schedule in ("fa2", "naive") else ["fwd"]
    problem = AttentionProblem(
        batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv_heads, seq_q=seq_q,
        seq_kv=seq_kv, head_dim=draw(st.sampled_from([16, 48, 64])),
        dtype=draw(st.sampled_from(["fp16", "fp32", "fp8"])), causal=draw(st.booleans()),
        pass_=draw(st.sampled_from(passes)),
    )
    return schedule, problem, Tiling(bm, bn, split_kv=split)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_closed_form_equals_trace_replay(case):
    schedule, problem, tiling = case
    trace = Trace.build(problem, tiling, schedule)
    names = trace.tensor_names
    formulas = closed_form(problem, tiling, schedule)
    assert [k.name for k in trace.kernels] == [f.name for f in formulas]
    for kernel, formula in zip(trace.kernels, formulas, strict=True):
        counts = record_counts(kernel.records, len(names))
        reads = {names[i]: int(v) for i, v in enumerate(counts["reads"]) if v}
        writes = {names[i]: int(v) for i, v in enumerate(counts["writes"]) if v}
        assert kernel.grid == formula.grid
        assert reads == {k: v for k, v in formula.reads.items() if v}, kernel.name
        assert writes == {k: v for k, v in formula.writes.items() if v}, kernel.name
        assert counts["tensor_flops"] == formula.tensor_flops
        assert counts["exp_ops"] == formula.exp_ops
        assert counts["other_flops"] == formula.other_flops


@settings(max_examples=40, deadline=None)
@given(cases())
def test_kernel_traffic_equals_trace(case):
    schedule, problem, tiling = case
    trace = Trace.build(problem, tiling, schedule)
    names = trace.tensor_names
    for kernel, traffic in zip(trace.kernels, kernel_traffic(problem, tiling, schedule),
                               strict=True):
        counts = record_counts(kernel.records, len(names))
        for i, name in enumerate(names):
            entry = traffic["per_tensor"].get(name, {"global_read": 0, "global_write": 0})
            assert entry["global_read"] == counts["reads"][i]
            assert entry["global_write"] == counts["writes"][i]


def _totals(problem, tiling, schedule):
    kernels = closed_form(problem, tiling, schedule)
    reads = sum(sum(k.reads.values()) for k in kernels)
    writes = sum(sum(k.writes.values()) for k in kernels)
    return reads, writes, sum(k.tensor_flops for k in kernels)


def test_fa2_forward_matches_issue_formula():
    # Non-causal: reads = Nq·d·s + Tr·2·Nkv·d·s, writes = Nq·d·s + 4·Nq per (batch, head).
    for nq, nkv, bm in [(1000, 777, 64), (4096, 4096, 128), (17, 3000, 16)]:
        p = AttentionProblem(batch=2, heads=3, seq_q=nq, seq_kv=nkv, head_dim=64, dtype="bf16")
        t = Tiling(bm, 32)
        tr, s, d = -(-nq // bm), 2, 64
        reads, writes, flops = _totals(p, t, "fa2")
        assert reads == 6 * (nq * d * s + tr * 2 * nkv * d * s)
        assert writes == 6 * (nq * d * s + 4 * nq)
        assert flops == p.convention_flops() == 4 * 6 * nq * nkv * d


def test_fa2_causal_is_about_half_and_more_than_half():
    p = AttentionProblem(batch=1, heads=1, seq_q=8192, head_dim=128)
    causal = AttentionProblem(batch=1, heads=1, seq_q=8192, head_dim=128, causal=True)
    t = Tiling(128, 64)
    full, half = _totals(p, t, "fa2")[2], _totals(causal, t, "fa2")[2]
    # Q block i visits 2(i+1) K/V blocks of 64 (diagonal blocks computed in full), so the
    # causal share is sum(i+1)/Tr^2 = (Tr+1)/(2 Tr) with Tr = 64: 65/128, about half.
    assert half * 128 == full * 65


def test_bigger_block_m_cuts_fa2_traffic_inverse_to_block_m():
    p = AttentionProblem(batch=1, heads=8, seq_q=16384, head_dim=128)
    kv = {bm: _totals(p, Tiling(bm, 64), "fa2")[0] for bm in (32, 64, 128)}
    q_bytes = 8 * 16384 * 128 * 2
    assert (kv[32] - q_bytes) == 2 * (kv[64] - q_bytes) == 4 * (kv[128] - q_bytes)


def test_backward_recomputation_is_3_5x_forward():
    p = AttentionProblem(batch=1, heads=2, seq_q=512, head_dim=64, pass_="bwd")
    fwd = AttentionProblem(batch=1, heads=2, seq_q=512, head_dim=64)
    t = Tiling(64, 64)
    assert 2 * _totals(p, t, "fa2")[2] == 7 * _totals(fwd, t, "fa2")[2]


def test_naive_bytes_grow_quadratically():
    t = Tiling(64, 64)
    small = _totals(AttentionProblem(1, 1, 2048, 64), t, "naive")[1]
    large = _totals(AttentionProblem(1, 1, 4096, 64), t, "naive")[1]
    assert 3.9 < large / small <= 4.0


def test_fa1_rereads_output_every_kv_block():
    p = AttentionProblem(batch=1, heads=1, seq_q=1024, head_dim=64)
    (k,) = closed_form(p, Tiling(64, 128), "fa1")
    tc = 1024 // 128
    o_bytes = 1024 * 64 * 2
    assert k.reads["o"] == tc * o_bytes
    assert k.writes["o"] == (tc + 1) * o_bytes  # initialisation plus every K/V block


def test_gqa_kv_reads_per_q_head():
    mha = AttentionProblem(batch=1, heads=8, seq_q=1024, head_dim=64)
    gqa = AttentionProblem(batch=1, heads=8, kv_heads=2, seq_q=1024, head_dim=64)
    t = Tiling(64, 64)
    # FA2 forward reads K/V once per q head, GQA or not: same global traffic.
    assert _totals(mha, t, "fa2")[0] == _totals(gqa, t, "fa2")[0]
    # Decode reads K/V once per group: 4x fewer K/V bytes.
    short = dict(batch=1, heads=8, seq_q=1, seq_kv=4096, head_dim=64)
    dec_mha = closed_form(AttentionProblem(**short), Tiling(16, 64, split_kv=4), "decode")[0]
    dec_gqa = closed_form(AttentionProblem(**short, kv_heads=2), Tiling(16, 64, split_kv=4),
                          "decode")[0]
    assert dec_mha.reads["k"] == 4 * dec_gqa.reads["k"]


def test_schedule_addresses_are_aligned_and_disjoint():
    p = AttentionProblem(batch=2, heads=4, kv_heads=2, seq_q=100, seq_kv=70, head_dim=48,
                         pass_="fwd+bwd")
    sched = build_schedule(p, Tiling(32, 16), "fa2")
    spans = sorted((t.base, t.base + t.nbytes) for t in sched.tensors.values())
    assert all(base % 256 == 0 for base, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    trace = Trace.from_schedule(sched)
    for k in trace.kernels:
        acc = k.records[k.records["op"] < 2]
        names = np.array(trace.tensor_names)[acc["tensor"]]
        base = np.array([sched.tensors[n].base for n in names])
        end = np.array([sched.tensors[n].base + sched.tensors[n].nbytes for n in names])
        last = acc["address"] + (acc["rows"].astype(np.uint64) - 1) * acc["row_stride"] \
            + acc["row_bytes"]
        assert (acc["address"] >= base).all() and (last <= end).all()
