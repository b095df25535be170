"""When what a kernel leaves dirty in L2 is written back, and whose time it is.

A kernel completes when its last CTA retires; L2 is a write-back cache that keeps its
contents across launches. So the last kernel of a run ends with its last CTA, its dirty
data counted in its DRAM writes but written back in no time the run reports; between
kernels the model writes it back before the next launch (``record.KernelRun``).
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
