"""Periodic trace expansion: the records equal a full-grid expansion, and the check falls back."""

from __future__ import annotations

import numpy as np
import pytest

from traces.expand import expand_kernel
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.schedules.base import (
    LOAD,
    STORE,
    Access,
    Compute,
    Kernel,
    Tensor,
    allocate,
    grid_coords,
)
from traces.schedules.period import find_period, periodic_loop
from traces.tiling import Tiling

CASES = [
    ("naive", AttentionProblem(1, 4, 130, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(32, 32)),
    ("naive", AttentionProblem(2, 2, 100, 32, seq_kv=77, pass_="fwd+bwd"), Tiling(32, 16)),
    ("fa1", AttentionProblem(2, 2, 150, 64, causal=True), Tiling(32, 32)),
    ("fa1", AttentionProblem(1, 3, 90, 64, seq_kv=200), Tiling(32, 32)),
    ("fa2", AttentionProblem(2, 4, 300, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(64, 32)),
    ("fa2", AttentionProblem(1, 3, 200, 32, seq_kv=333, pass_="fwd+bwd"), Tiling(32, 64, 3)),
    # seq_q > seq_kv with causal masking: the first Q blocks see no K/V (empty loops).
    ("fa2", AttentionProblem(2, 2, 200, 32, seq_kv=90, causal=True), Tiling(32, 16)),
    ("decode", AttentionProblem(2, 8, 3, 64, seq_kv=700, kv_heads=2, causal=True),
     Tiling(block_n=64, split_kv=4)),
    ("decode", AttentionProblem(3, 4, 1, 64, seq_kv=1000), Tiling(block_n=64, split_kv=3)),
]


def _ids(tensors) -> dict[str, int]:
    return {name: i for i, name in enumerate(tensors)}


@pytest.mark.parametrize("name,problem,tiling", CASES)
def test_periodic_records_equal_full_grid_records(name, problem, tiling):
    sched = build_schedule(problem, tiling, name)
    ids = _ids(sched.tensors)
    compressed = 0
    for kernel in sched.kernels:
        loop = periodic_loop(kernel)
        assert loop.period == find_period(kernel), kernel.name  # verified, no fallback
        compressed += loop.period < kernel.grid
        records = expand_kernel(kernel, ids)
        full = expand_kernel(kernel, ids, compress=False)
        assert records.size == full.size > 0
        assert np.array_equal(records, full), kernel.name
    assert compressed  # every case has a kernel that really runs one period


def test_period_of_fa2_forward_is_one_plane_of_q_blocks():
    p = AttentionProblem(2, 3, 1000, 64, causal=True)
    kernel = build_schedule(p, Tiling(128, 64), "fa2").kernels[0]
    loop = periodic_loop(kernel)
    assert loop.period == 8  # ceil(1000 / 128)
    # Causal Q block i visits K/V blocks 0 .. 2i+1 (block_n = block_m / 2).
    assert list(loop.loop_first) == [0, 2, 6, 12, 20, 30, 42, 56]
    assert loop.masks.shape[1] == sum(min(2 * i + 2, 16) for i in range(8))
    k_step = 0  # K load: plane bh, shifted by one plane per head (kv_heads == heads)
    assert np.array_equal(loop.plane_offset[k_step], np.arange(kernel.grid) // 8)
    assert not loop.plane_offset[2].any()  # the compute step


# A hand-made kernel whose grid looks periodic (period 4 of 24 CTAs) but whose loop may not
# be the representative's loop moved by a constant plane.
GRID_I, PLANES, ITERATIONS = 4, 6, 3


def _kernel(loop) -> Kernel:
    tensors = allocate([Tensor("x", 64, 64, 32, 2), Tensor("y", PLANES, 32, 8, 2)])
    return Kernel(
        name="probe", ctas=grid_coords(("i", GRID_I), ("bh", PLANES)),
        loop_count=np.full(GRID_I * PLANES, ITERATIONS, dtype=np.int64),
        pre=[Access(LOAD, "y", 8, 8, lambda c: (c["bh"], c["i"], 0))],
        loop=loop,
        post=[Access(STORE, "y", 8, 8, lambda c: (c["bh"], c["i"], 0))],
        sram_bytes=0, tensors=tensors,
    )


def _shifted(c):
    return 2 * c["bh"] + 1, c["t"] + c["i"], 0


def _row_block_of_late_planes(c):
    return c["bh"], c["t"] + (c["bh"] >= 3), 0


def _plane_step_grows_with_t(c):
    return c["bh"] * (c["t"] + 1), c["t"], 0


NOT_PERIODIC = {
    "row block depends on the plane": [Access(LOAD, "x", 8, 8, _row_block_of_late_planes)],
    "plane shift grows with t": [Access(LOAD, "x", 8, 8, _plane_step_grows_with_t)],
    "mask depends on the plane": [
        Access(LOAD, "x", 8, 8, _shifted, when=lambda c: (c["bh"] != 3) | (c["t"] > 0))],
    "compute depends on the plane": [Access(LOAD, "x", 8, 8, _shifted),
                                     Compute(lambda c: (c["bh"] * 10 + c["t"], 1, 0))],
}


def test_periodic_probe_kernel_keeps_its_period():
    kernel = _kernel([Access(LOAD, "x", 8, 8, _shifted), Compute(lambda c: (c["t"], c["i"], 1))])
    loop = periodic_loop(kernel)
    assert find_period(kernel) == loop.period == GRID_I
    assert loop.masks.shape == (2, GRID_I * ITERATIONS)
    assert np.array_equal(loop.plane_offset[0], 2 * (np.arange(GRID_I * PLANES) // GRID_I))
    ids = _ids(kernel.tensors)
    assert np.array_equal(expand_kernel(kernel, ids), expand_kernel(kernel, ids, compress=False))


@pytest.mark.parametrize("case", list(NOT_PERIODIC))
def test_non_periodic_loop_falls_back_to_the_full_grid(case):
    kernel = _kernel(NOT_PERIODIC[case])
    assert find_period(kernel) == GRID_I  # the coordinates alone look periodic
    loop = periodic_loop(kernel)
    assert loop.period == kernel.grid
    assert loop.masks.shape[1] == kernel.grid * ITERATIONS
    assert not loop.plane_offset.any()
    ids = _ids(kernel.tensors)
    records = expand_kernel(kernel, ids)
    assert np.array_equal(records, expand_kernel(kernel, ids, compress=False))
    # The records follow the loop of each CTA itself, e.g. the last CTA's first load.
    last = records[(records["cta"] == kernel.grid - 1) & (records["phase"] == 1)]
    loads = last[last["op"] == LOAD]
    bh = (kernel.grid - 1) // GRID_I
    plane, row_block, _ = NOT_PERIODIC[case][0].coords(
        {"bh": np.array([bh]), "i": np.array([GRID_I - 1]), "t": np.array([0]),
         "cta": np.array([kernel.grid - 1])})
    assert (int(loads["plane"][0]), int(loads["row_block"][0])) == (int(np.squeeze(plane)),
                                                                    int(np.squeeze(row_block)))
