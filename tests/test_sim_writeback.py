"""When what a kernel leaves dirty in L2 is written back, and whose time it is.

A kernel completes when its last CTA retires; L2 is a write-back cache that keeps its
contents across launches. So the last kernel of a run ends with its last CTA (and the
write-backs of what it evicted), what it leaves dirty counted in its DRAM writes but
written back in no time the run reports; between kernels the model writes it back before
the next launch (``record.KernelRun``).
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
    assert k.flush_bytes > 0
    assert k.dram_write == k.global_write == 1 * 8 * 1024 * (128 * 2 + 4)


@pytest.mark.parametrize("mode", ["full", "aggregated"])
def test_between_kernels_the_dirty_data_is_written_back_first(mode):
    problem = AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=64)  # S, P: 8 MiB
    runs = run(problem, Tiling(64, 64, 2), "naive", HW, mode).runs
    assert [r.name for r in runs] == ["naive_qk", "naive_softmax", "naive_pv"]
    for r in runs[:-1]:
        assert r.flush_bytes > 0  # S, then P, stay in L2
        wait = r.flush_bytes / HW.hbm_effective_bytes_per_s
        assert r.end_s >= float(r.cta_end.max()) + wait * (1 - 1e-9)
    assert runs[-1].end_s == pytest.approx(float(runs[-1].cta_end.max()), rel=1e-12)
    # Every byte stored reaches DRAM once, whenever it is written back.
    assert sum(r.dram_write for r in runs) == sum(r.global_write for r in runs)


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
        assert 0 < k.flush_bytes <= hw.l2_bytes
        moved = k.dram_read + k.dram_write - k.flush_bytes
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
        assert entry["bytes"]["left_dirty"] == r.flush_bytes
        assert 0 < entry["bytes"]["left_dirty"] <= entry["bytes"]["dram_write"]
    # S and P (8 MiB each) fit the H100's L2: all of each is still dirty at its end
    assert [e["bytes"]["left_dirty"] for e in pred["kernels"][:2]] == [8 * 2**20] * 2
