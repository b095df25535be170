"""When what a kernel leaves dirty in L2 is written back, and whose time and bytes it is.

A kernel completes when its last CTA retires; L2 is a write-back cache that keeps its
contents across launches. So a kernel ends with its last CTA (and the write-backs of what
it evicted); what it leaves dirty stays in L2, where the next kernel hits it or evicts it
and pays for the write-backs in its own HBM time; after the last kernel it is written back
in no time the run reports. The bytes are the DRAM writes of the kernel that stored them
(``record.KernelRun``).
"""

from __future__ import annotations

import pytest

from simulator.hardware import load_hardware
from simulator.sim import run
from traces.problem import AttentionProblem
from traces.tiling import Tiling

HW = load_hardware("h100-sxm5")


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_the_last_kernel_ends_with_its_last_cta(mode):
    problem = AttentionProblem(batch=1, heads=8, seq_q=1024, head_dim=128)  # O: 2 MiB
    (k,) = run(problem, Tiling(128, 64, 2), "fa2", HW, mode).runs
    assert k.end_s == pytest.approx(float(k.cta_end.max()), rel=1e-12)
    # O and the LSE stay in L2 (dirty) and are counted as DRAM writes all the same.
    assert k.left_dirty == k.dram_write
    assert k.dram_write == k.global_write == 1 * 8 * 1024 * (128 * 2 + 4)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_what_a_kernel_leaves_dirty_stays_in_l2_for_the_next(mode):
    """Naive attention whose S and P (8 MiB each) fit the H100's L2 with everything else:
    no kernel evicts anything, so each ends with its last CTA, writes nothing to DRAM while
    it runs, and leaves all it stored dirty (its DRAM writes, all the same)."""
    problem = AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=64)
    sim = run(problem, Tiling(64, 64, 2), "naive", HW, mode)
    assert [r.name for r in sim.runs] == ["naive_qk", "naive_softmax", "naive_pv"]
    for r in sim.runs:
        assert r.end_s == pytest.approx(float(r.cta_end.max()), rel=1e-12)
        assert r.carried_writeback_bytes == 0
        assert r.hbm_bytes == r.dram_read  # nothing written back while it ran
        assert r.left_dirty == r.dram_write == r.global_write
    s_bytes = 4 * 1024 * 1024 * 2
    assert [r.left_dirty for r in sim.runs[:2]] == [s_bytes, s_bytes]
    # The softmax reads S, the P.V kernel P, from L2: DRAM reads are Q, K and V.
    assert [r.dram_read for r in sim.runs] == [2 * 4 * 1024 * 64 * 2, 0, 4 * 1024 * 64 * 2]
    # What the last kernel found dirty of S is still there: L2 holds S, P and O dirty.
    assert list(sim.runs[-1].dirty_bytes[[sim.tensor_names.index(t) for t in "spo"]]) == [
        s_bytes, s_bytes, 4 * 1024 * 64 * 2]


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_the_next_kernel_evicts_what_the_last_left_dirty_and_pays_for_it(mode):
    """Naive attention with S and P (32 MiB each) sixteen times a 2 MiB L2: the QK kernel
    leaves the last of S dirty; the softmax, reading S from its first rows and storing P,
    evicts all of it before it reads those rows, and writes it back in its own HBM time:
    its carried write-backs are what the QK kernel left dirty, bytes of the QK kernel's."""
    from dataclasses import replace

    hw = replace(HW, l2_bytes=2 * 2**20)
    problem = AttentionProblem(batch=1, heads=16, seq_q=1024, head_dim=64)
    qk, softmax, pv = run(problem, Tiling(64, 64, 2), "naive", hw, mode).runs
    s_bytes = 16 * 1024 * 1024 * 2
    assert 0 < qk.left_dirty <= hw.l2_bytes
    assert softmax.carried_writeback_bytes == qk.left_dirty
    assert qk.dram_write == s_bytes and softmax.dram_write == s_bytes  # S, then P
    assert softmax.dram_read == s_bytes  # none of S was still there when read
    assert softmax.hbm_bytes == (softmax.dram_read + softmax.dram_write - softmax.left_dirty
                                 + softmax.carried_writeback_bytes)
    assert softmax.end_s - softmax.start_s >= softmax.hbm_bytes / hw.hbm_effective_bytes_per_s
    # Every byte stored reaches DRAM once: while some kernel runs, or after the last.
    runs = (qk, softmax, pv)
    assert sum(r.dram_write for r in runs) == sum(r.global_write for r in runs)
    written_while_running = sum(r.hbm_bytes - r.dram_read for r in runs)
    assert written_while_running + int(pv.dirty_bytes.sum()) == sum(r.global_write for r in runs)


def test_the_last_kernel_pays_for_the_write_backs_of_what_it_evicted():
    """Naive softmax as the last kernel, its S and P eight times L2: it reads S and writes
    P, and all of P but what it leaves dirty reaches DRAM before it ends. The aggregated
    engine's write-back flow, a fair share of HBM among all resident CTAs, lags behind
    them; it once ended the last kernel with its last CTA, the lag dropped, at 0.68x the
    full engine's time here. Both engines now take at least HBM's time for those bytes
    and agree."""
    from dataclasses import replace

    hw = replace(HW, l2_bytes=2 * 2**20)
    problem = AttentionProblem(batch=1, heads=16, seq_q=1024, head_dim=64)  # S, P: 32 MiB
    times = {}
    for mode in ("full", "aggregated"):
        (k,) = run(problem, Tiling(64, 64, 2), "naive", hw, mode, alone=1).runs  # softmax
        assert k.name == "naive_softmax"
        s_bytes = 16 * 1024 * 1024 * 2
        assert k.dram_read == s_bytes and k.dram_write == s_bytes
        assert 0 < k.left_dirty <= hw.l2_bytes
        moved = k.dram_read + k.dram_write - k.left_dirty
        assert k.hbm_bytes == moved
        times[mode] = k.end_s - k.start_s
        assert times[mode] >= moved / hw.hbm_effective_bytes_per_s
    assert times["aggregated"] == pytest.approx(times["full"], rel=0.05)


def test_the_prediction_says_what_each_kernel_left_dirty():
    """Each kernel's ``left_dirty`` in the prediction JSON is what L2 held dirty of it at
    its end: part of its DRAM writes (Nsight Compute's writes of a kernel leave it out)."""
    from simulator.sim import simulate

    problem = AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=64)  # S, P: 8 MiB
    pred = simulate(problem, Tiling(64, 64, 2), "naive", HW, timeline=True)
    runs = pred.pop("timeline")
    for entry, r in zip(pred["kernels"], runs, strict=True):
        assert entry["bytes"]["left_dirty"] == r.left_dirty
        assert 0 < entry["bytes"]["left_dirty"] <= entry["bytes"]["dram_write"]
        assert entry["bytes"]["carried_dram_write"] == r.carried_writeback_bytes == 0
    # S and P (8 MiB each) fit the H100's L2: all of each is still dirty at its end
    assert [e["bytes"]["left_dirty"] for e in pred["kernels"][:2]] == [8 * 2**20] * 2


def test_a_schedule_with_two_kernels_storing_one_tensor_is_refused():
    """What a kernel leaves dirty is attributed to it by tensor: two kernels storing one
    tensor would count its bytes twice, so ``run`` refuses such a schedule."""
    from dataclasses import replace

    from simulator.sim import check_one_storer
    from traces.schedules import build_schedule

    sched = build_schedule(AttentionProblem(batch=1, heads=2, seq_q=256, head_dim=64),
                           Tiling(64, 64, 2), "naive")
    check_one_storer(sched)  # naive: S, P and O, one kernel each
    qk, softmax, pv = sched.kernels
    store_s = [s for s in qk.pre + qk.loop + qk.post if getattr(s, "tensor", None) == "s"]
    assert store_s
    pv_stores_s = replace(pv, post=pv.post + store_s)
    with pytest.raises(ValueError, match="'s' is stored by naive_qk and naive_pv"):
        check_one_storer(replace(sched, kernels=[qk, softmax, pv_stores_s]))
