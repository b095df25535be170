"""Programs as arrays: the period compression is exact, and the totals are the counts."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.counting import closed_form
from simulator.hardware import load_hardware
from simulator.sim import predict
from simulator.sim.compute import sm_rates, uses_wgmma
from simulator.sim.program import kernel_program, schedule_programs
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.schedules.base import LOAD, STORE, Access
from traces.schedules.mma_layout import matmul_costs
from traces.schedules.period import find_period
from traces.tiling import Tiling

HW = load_hardware("h100-sxm5")

CASES = [
    ("fa2", AttentionProblem(2, 4, 300, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(64, 32)),
    ("fa2", AttentionProblem(1, 3, 200, 32, seq_kv=333), Tiling(32, 64, 3)),
    ("naive", AttentionProblem(1, 4, 130, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(32, 32)),
    ("fa1", AttentionProblem(2, 2, 150, 64, causal=True), Tiling(32, 32)),
    ("decode", AttentionProblem(2, 8, 3, 64, seq_kv=700, kv_heads=2, causal=True),
     Tiling(block_n=64, split_kv=4)),
]


def _expanded(prog, field):
    """Per-CTA loop values of ``field`` for every CTA, from the period and the offsets."""
    parts = []
    for c in range(prog.grid):
        units = np.asarray(prog.loop_units(c), dtype=np.int64)
        values = getattr(prog.loop, field)[:, units]
        if field == "plane":
            values = values + prog.plane_offset[:, [c]]
        parts.append(values)
    return np.concatenate(parts, axis=1) if parts else np.zeros((0, 0))


@pytest.mark.parametrize("name,problem,tiling", CASES)
def test_compressed_loop_equals_full_evaluation(name, problem, tiling):
    sched = build_schedule(problem, tiling, name)
    for kernel in sched.kernels:
        short = kernel_program(kernel, sched, HW)
        full = kernel_program(kernel, sched, HW, compress=False)
        assert full.period == kernel.grid
        for field in ("mask", "row_block", "col_block", "nbytes", "plane"):
            assert np.array_equal(_expanded(short, field), getattr(full.loop, field)), field
        for total in ("load_bytes", "store_bytes", "compute_s"):
            assert np.array_equal(short.totals()[total], full.totals()[total])


def test_period_of_fa2_is_the_q_blocks_of_one_head():
    p = AttentionProblem(2, 3, 1000, 64)
    kernel = build_schedule(p, Tiling(128, 64), "fa2").kernels[0]
    assert find_period(kernel) == 8  # ceil(1000 / 128)
    fa1 = build_schedule(p, Tiling(64, 64), "fa1").kernels[0]
    assert find_period(fa1) == 1


# Lengths that are multiples of the tiles, decode groups of 16 rows (G * Nq) and a power of
# two of query rows: no tile is partial or padded, so the work issued is the work counted.
ALIGNED = [
    ("fa2", AttentionProblem(2, 4, 256, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(64, 32)),
    ("fa2", AttentionProblem(1, 3, 192, 32, seq_kv=320), Tiling(32, 64, 3)),
    ("naive", AttentionProblem(1, 4, 128, 64, kv_heads=2, causal=True, pass_="fwd+bwd"),
     Tiling(32, 32)),
    ("fa1", AttentionProblem(2, 2, 160, 64, causal=True), Tiling(32, 32)),
    ("decode", AttentionProblem(2, 16, 2, 64, seq_kv=704, kv_heads=2, causal=True),
     Tiling(block_n=64, split_kv=4)),
]


def _timed_work(kernel, prog, tiling, dtype):
    """Tensor FLOPs, exps, other FLOPs and shared-memory operand bytes the simulator times,
    from its unit seconds, at the clock the kernel runs (a kernel with matmuls at the
    preset's tensor clock)."""
    hw = HW.at_tensor_clock() if kernel.dots else HW
    rates = sm_rates(hw, dtype, uses_wgmma(HW, kernel.mma_rows, tiling.num_warps))
    return prog.totals()["unit_s"].sum(axis=1) * rates


def _issued_work(kernel, prog, tiling, dtype):
    """Tensor FLOPs, exps and other FLOPs the simulator times."""
    return _timed_work(kernel, prog, tiling, dtype)[:3]


def _tiled_tensors(kernel):
    """The tensors ``kernel`` moves as tiles of several columns (not vectors)."""
    accesses = [s for s in (*kernel.pre, *kernel.loop, *kernel.post) if isinstance(s, Access)]
    tiled = {s.tensor for s in accesses if s.tile_cols > 1}
    assert tiled.isdisjoint(s.tensor for s in accesses if s.tile_cols == 1)
    return tiled


def _copies(kernel, tiling, problem):
    """How many times the warp layout has the tensor, exp and other work done."""
    costs = matmul_costs(list(kernel.dots), tiling.num_warps, problem.elem_bytes,
                         uses_wgmma(HW, kernel.mma_rows, tiling.num_warps))
    return np.array([costs.tensor_scale, costs.elementwise_scale, costs.elementwise_scale])


@pytest.mark.parametrize("name,problem,tiling", CASES + ALIGNED)
def test_totals_are_the_closed_form_counts(name, problem, tiling):
    sched = build_schedule(problem, tiling, name)
    for kernel, prog, count in zip(sched.kernels, schedule_programs(sched, HW),
                                   closed_form(problem, tiling, name), strict=True):
        totals = prog.totals()
        assert totals["load_bytes"].sum() == sum(count.reads.values())
        assert totals["store_bytes"].sum() == sum(count.writes.values())
        work = _issued_work(kernel, prog, tiling, problem.dtype)
        smem = _timed_work(kernel, prog, tiling, problem.dtype)[3]
        wgmma = uses_wgmma(HW, kernel.mma_rows, tiling.num_warps)
        costs = matmul_costs(list(kernel.dots), tiling.num_warps, problem.elem_bytes, wgmma)
        # mma.sync matmuls read their operands from shared memory, wgmma ones do not, and
        # the shuffles of their row reductions take a clock of it each (128 bytes' worth);
        # any kernel with matmuls also stages its tiles there: every tile loaded (not a
        # vector), and twice every tile stored, whole tiles as issued (the counts: valid
        # bytes)
        operands = 0.0 if wgmma else costs.smem_bytes_per_flop
        reads = work[0] * (operands + costs.shuffles_per_flop * 128)
        tiled = _tiled_tensors(kernel)
        staged = 0 if not kernel.dots else (
            sum(count.reads.get(t, 0) for t in tiled)
            + 2 * sum(count.writes.get(t, 0) for t in tiled))
        # and its global loads and stores of those tiles pass the same pipe, twice each
        # (program.GLOBAL_PIPE_PASSES): every tile stored (STG), every tile loaded outside
        # the (pipelined) loop (LDG, then STS); the loop's loads go global to shared in one
        # pass (cp.async)
        pipe = totals["pipe_bytes"].sum()
        loaded_outside = sum(p.nbytes[(p.kind == LOAD) & (p.tile_cols > 1)].sum()
                             for p in (prog.pre, prog.post))
        if (name, problem, tiling) in ALIGNED and staged:
            assert pipe == sum(count.writes.get(t, 0) for t in tiled) + loaded_outside
        elif not staged:
            assert pipe == 0
        if (name, problem, tiling) in ALIGNED or not staged:
            assert smem - 2 * pipe == pytest.approx(reads + staged, rel=1e-9, abs=1e-6)
        else:
            assert smem - 2 * pipe >= (reads + staged) * (1 - 1e-12)
        # the work counted, times the copies the warp layout makes of it (the FA2 forward
        # at 32 x 64 with d = 32 computes everything twice: 4 warps along 32 rows)
        expected = np.array([count.tensor_flops, count.exp_ops, count.other_flops]) * _copies(
            kernel, tiling, problem)
        if (name, problem, tiling) in ALIGNED:
            assert work == pytest.approx(expected, rel=1e-9)
        else:  # partial or padded tiles: the hardware computes more than is counted
            assert (work >= expected * (1 - 1e-12)).all()
            assert work[0] > count.tensor_flops or count.tensor_flops == 0
        # The busiest unit of each step bounds the step: between the largest unit's total
        # and the sum of all units.
        assert totals["compute_s"].sum() >= totals["unit_s"].sum(axis=1).max() * (1 - 1e-12)
        assert totals["compute_s"].sum() <= totals["unit_s"].sum() * (1 + 1e-12)


def test_loads_precede_stores_in_phase_tables():
    p = AttentionProblem(1, 2, 256, 64)
    prog = schedule_programs(build_schedule(p, Tiling(), "fa2"), HW)[0]
    assert list(prog.pre.kind) == [LOAD] and list(prog.post.kind) == [STORE, STORE]
    assert list(prog.loop.kind) == [LOAD, LOAD]


def _padded(problem: AttentionProblem, tiling: Tiling) -> AttentionProblem:
    """The problem with both lengths rounded up to whole tiles."""
    def up(n, tile):
        return -(-n // tile) * tile
    return AttentionProblem(problem.batch, problem.heads, up(problem.seq_q, tiling.block_m),
                            problem.head_dim, seq_kv=up(problem.seq_kv, tiling.block_n),
                            kv_heads=problem.kv_heads, pass_=problem.pass_)


@pytest.mark.parametrize("name,problem,tiling", [
    ("fa2", AttentionProblem(1, 3, 200, 32, seq_kv=333, pass_="fwd+bwd"), Tiling(32, 64)),
    ("fa1", AttentionProblem(2, 2, 150, 64), Tiling(32, 64)),
    ("naive", AttentionProblem(1, 4, 130, 64, kv_heads=2, pass_="fwd+bwd"), Tiling(64, 32)),
])
def test_partial_tiles_issue_the_work_of_whole_tiles(name, problem, tiling):
    """A Triton kernel computes a partial tile whole (masked elements included): without
    causal masking, the work issued is the work counted for the lengths padded to whole
    tiles. Naive's softmax is one CTA per valid row, each issuing a power-of-two row."""
    sched = build_schedule(problem, tiling, name)
    padded = closed_form(_padded(problem, tiling), tiling, name)
    for kernel, prog, count in zip(sched.kernels, schedule_programs(sched, HW), padded,
                                   strict=True):
        work = _issued_work(kernel, prog, tiling, problem.dtype)
        if kernel.name == "naive_softmax":
            rows = problem.batch * problem.heads * problem.seq_q
            width = 1 << (problem.seq_kv - 1).bit_length()  # 130 -> 256
            assert list(work) == pytest.approx([0, rows * width, 4 * rows * width], rel=1e-9)
            continue
        expected = np.array([count.tensor_flops, count.exp_ops, count.other_flops]) * _copies(
            kernel, tiling, problem)
        assert work == pytest.approx(expected, rel=1e-9), kernel.name


def test_decode_issues_its_padded_group_rows():
    """G * Nq = 4 * 3 = 12 query rows per CTA are padded to a 16-row matmul (and the
    combine kernel's 3 rows to 4): the work issued is the counted work x 16/12 (x 4/3)."""
    problem = AttentionProblem(2, 8, 3, 64, seq_kv=704, kv_heads=2)
    tiling = Tiling(block_n=64, split_kv=4)
    sched = build_schedule(problem, tiling, "decode")
    counts = closed_form(problem, tiling, "decode")
    for kernel, prog, count, ratio in zip(sched.kernels, schedule_programs(sched, HW), counts,
                                          (16 / 12, 4 / 3), strict=True):
        work = _issued_work(kernel, prog, tiling, problem.dtype)
        expected = np.array([count.tensor_flops, count.exp_ops, count.other_flops]) * ratio
        assert work == pytest.approx(expected, rel=1e-9), kernel.name


def test_short_softmax_rows_issue_the_twins_sixteen_columns():
    """naive_softmax's twin holds ``pow2_at_least(Nkv, 16)`` columns (one rule, shared
    with the kernels): a row of 8 keys issues 16 exps."""
    from traces.schedules.base import pow2_at_least

    assert [pow2_at_least(n) for n in (1, 3, 16, 17)] == [1, 4, 16, 32]
    assert pow2_at_least(5, 16) == 16 and pow2_at_least(130, 16) == 256
    problem, tiling = AttentionProblem(1, 2, 8, 64), Tiling(16, 16)
    sched = build_schedule(problem, tiling, "naive")
    softmax = [(k, p) for k, p in zip(sched.kernels, schedule_programs(sched, HW), strict=True)
               if k.name == "naive_softmax"]
    (kernel, prog), = softmax
    rows = problem.batch * problem.heads * problem.seq_q
    assert list(_issued_work(kernel, prog, tiling, problem.dtype)) == pytest.approx(
        [0, rows * 16, 4 * rows * 16], rel=1e-9)


def test_staging_by_hand():
    # FA2 forward at 32 x 32, d = 64, N = 128 on 4 warps: mma.sync (32 rows). Each CTA
    # stages its Q tile (32 x 64 bf16: 4 KB), four iterations of K and V tiles (4 KB each)
    # and its O tile twice (written in the matmul's layout, read back coalesced); its LSE
    # vector goes straight from registers. Shared bytes beyond the operand reads: 45,056.
    # The L1 data pipe also carries Q's global load (outside the loop: LDG, then STS) and
    # O's global store (STG), not the loop's K and V (cp.async, at 2 stages): 8 KB, which
    # take two passes of the pipe each (16 KB more).
    problem, tiling = AttentionProblem(1, 1, 128, 64), Tiling(32, 32)
    sched = build_schedule(problem, tiling, "fa2")
    kernel, prog = sched.kernels[0], schedule_programs(sched, HW)[0]
    assert not uses_wgmma(HW, kernel.mma_rows, tiling.num_warps)
    costs = matmul_costs(list(kernel.dots), tiling.num_warps, 2, False)
    per_flop = costs.smem_bytes_per_flop + costs.shuffles_per_flop * 128  # a clock each
    smem = _timed_work(kernel, prog, tiling, problem.dtype)[3]
    staged = smem - prog.totals()["work"][0].sum() * per_flop
    assert staged == pytest.approx(4 * (4096 + 4 * 2 * 4096 + 2 * 4096) + 2 * 4 * 2 * 4096,
                                   rel=1e-12)
    assert prog.totals()["pipe_bytes"].sum() == 4 * 2 * 4096
    # At one stage Triton does not pipeline the loop: K and V come through registers too.
    single = Tiling(32, 32, num_stages=1)
    sched = build_schedule(problem, single, "fa2")
    prog = schedule_programs(sched, HW)[0]
    assert prog.totals()["pipe_bytes"].sum() == 4 * (2 * 4096 + 4 * 2 * 4096)
    # A wgmma kernel's operand reads are its tensor rate's, not timed here, but it stages the
    # same tiles: at 128 x 64, 8 warps, N = 512, four CTAs each stage Q (16 KB) and load it
    # through registers (16 KB, two passes), eight iterations of K and V (8 KB each,
    # cp.async), and O twice and stored (16 KB, two passes); its shuffles take a clock each.
    wide = Tiling(128, 64, num_warps=8)
    sched = build_schedule(AttentionProblem(1, 1, 512, 64), wide, "fa2")
    kernel, prog = sched.kernels[0], schedule_programs(sched, HW)[0]
    assert uses_wgmma(HW, kernel.mma_rows, wide.num_warps)
    costs = matmul_costs(list(kernel.dots), wide.num_warps, 2, True)
    assert costs.smem_bytes_per_flop == 0.0 and costs.shuffles_per_flop > 0
    smem = _timed_work(kernel, prog, wide, problem.dtype)[3]
    staged = smem - prog.totals()["work"][0].sum() * costs.shuffles_per_flop * 128
    assert staged == pytest.approx(4 * (3 * 16384 + 8 * 2 * 8192 + 4 * 16384), rel=1e-12)
    assert prog.totals()["pipe_bytes"].sum() == 4 * 2 * 16384


def test_a_warp_goes_through_its_instructions_no_faster_than_the_measured_pace():
    """The preset's ``warp_cycles_per_instruction`` floors a CTA's critical path: naive
    softmax's one row of 16k keys, causal, 4 warps, whose compile issues 2,253 instructions
    a warp (Triton 3.6, sm_90), takes at least 2253 x 5.15 cycles at 1.98 GHz (5.86 us),
    where its units alone would take 0.8 us; a loop iteration takes at least its main
    loop's instructions at that pace, at the kernel's own clock (FA2 with matmuls: 1.789
    GHz). Unmeasured (the preset's None) or not compiled, nothing changes."""
    import dataclasses

    from simulator.occupancy import CompiledResources

    h200 = load_hardware("h200-sxm")
    assert h200.warp_cycles_per_instruction == 5.15
    problem = AttentionProblem(1, 1, 16384, 64, causal=True)
    sched = build_schedule(problem, Tiling(64, 64), "naive")
    softmax = next(k for k in sched.kernels if k.name == "naive_softmax")
    given = {"naive_softmax": CompiledResources(203, 16, straight_instructions=2253)}
    bare = kernel_program(softmax, sched, h200)
    floored = kernel_program(softmax, sched, h200, compiled=given)
    assert bare.pre.path_s.max() < 1e-6
    np.testing.assert_allclose(floored.pre.path_s, 2253 * 5.15 / 1.98e9, rtol=1e-12)
    unmeasured = dataclasses.replace(h200, warp_cycles_per_instruction=None)
    np.testing.assert_array_equal(
        kernel_program(softmax, sched, unmeasured, compiled=given).pre.path_s, bare.pre.path_s)
    # the prediction says what it knew: 1k rows of 16k keys, two CTAs per SM, wait on it
    short = AttentionProblem(1, 1, 1024, 64, seq_kv=16384, causal=True)
    timed, _ = predict(short, Tiling(64, 64), "naive", h200, compiled=given)
    untimed, _ = predict(short, Tiling(64, 64), "naive", h200)
    (entry,) = [k for k in timed["kernels"] if k["name"] == "naive_softmax"]
    assert entry["straight_instructions"] == 2253 and entry["loop_instructions"] is None
    assert entry["time_s"] > [k for k in untimed["kernels"]
                              if k["name"] == "naive_softmax"][0]["time_s"]

    sched = build_schedule(AttentionProblem(1, 1, 1024, 128), Tiling(128, 32, 3, 4), "fa2")
    (fwd,) = sched.kernels
    bare = kernel_program(fwd, sched, h200)
    iteration = bare.loop.path_s.max()
    slow = int(2 * iteration * 1.789e9 / 5.15)  # twice the units' path at the pace
    floored = kernel_program(fwd, sched, h200, compiled={
        "fa2_fwd": CompiledResources(165, 40960, loop_instructions=slow)})
    np.testing.assert_allclose(floored.loop.path_s, slow * 5.15 / 1.789e9, rtol=1e-12)
    fast = kernel_program(fwd, sched, h200, compiled={
        "fa2_fwd": CompiledResources(165, 40960, loop_instructions=slow // 4)})
    np.testing.assert_array_equal(fast.loop.path_s, bare.loop.path_s)
    np.testing.assert_array_equal(fast.pre.path_s, bare.pre.path_s)  # a loop: no straight run
    # its prologue and epilogue: at least their instructions outside the loop at the pace
    around = kernel_program(fwd, sched, h200, compiled={"fa2_fwd": CompiledResources(
        165, 40960, loop_instructions=slow // 4, prologue_instructions=435,
        epilogue_instructions=1014)})
    np.testing.assert_allclose(around.pre.path_s, 435 * 5.15 / 1.789e9, rtol=1e-12)
    np.testing.assert_allclose(around.post.path_s, 1014 * 5.15 / 1.789e9, rtol=1e-12)
    assert bare.post.path_s.max() < 1014 * 5.15 / 1.789e9 / 4  # its units' path: shorter
    np.testing.assert_array_equal(around.loop.path_s, bare.loop.path_s)


def test_the_schedule_marks_the_iterations_the_kernels_run_masked():
    """FA2's iterations over blocks that need a mask (``Kernel.loop_masked``), as its
    Triton kernels split their loops (``kernels.common.kv_blocks_visible``,
    ``q_blocks_visible``): the causal diagonal and a partial last tile, by hand."""

    def masked(problem, tiling, name):
        (kernel,) = [k for k in build_schedule(problem, tiling, "fa2").kernels
                     if k.name == name]
        flags = kernel.masked_iterations()
        return np.split(flags, np.cumsum(kernel.loop_count)[:-1])

    # causal, 64 x 64 at N = 256: Q block i visits K/V blocks 0..i, the last on the diagonal
    for cta in masked(AttentionProblem(1, 1, 256, 64, causal=True), Tiling(64, 64), "fa2_fwd"):
        assert cta.tolist() == [False] * (cta.size - 1) + [True]
    # 128 x 64: Q block 0 (rows 0-127) masks both its blocks, block 1 (rows 128-255) its
    # last two: row 128 sees columns up to 128, not all of block 2 (128-191)
    first, second = masked(AttentionProblem(1, 1, 256, 64, causal=True), Tiling(128, 64),
                           "fa2_fwd")
    assert first.tolist() == [True, True] and second.tolist() == [False, False, True, True]
    # not causal, N = 200 with BN = 64: the partial last block, in every CTA of dQ too
    for name, pass_ in (("fa2_fwd", "fwd"), ("fa2_bwd_dq", "bwd")):
        for cta in masked(AttentionProblem(1, 1, 200, 64, pass_=pass_), Tiling(64, 64), name):
            assert cta.tolist() == [False, False, False, True]
    # dK/dV, causal, 16 x 64 at N = 128: K/V block 0 is seen by Q blocks 0-7, the first four
    # (rows 0-63) masked; block 1 by Q blocks 4-7, all on its diagonal; a group of two heads
    # repeats them per head
    ctas = masked(AttentionProblem(1, 2, 128, 64, kv_heads=1, causal=True, pass_="bwd"),
                  Tiling(16, 64), "fa2_bwd_dkdv")
    assert [c.tolist() for c in ctas] == [([True] * 4 + [False] * 4) * 2, [True] * 8]
    assert not any(f.any() for f in masked(AttentionProblem(1, 1, 256, 64, pass_="bwd"),
                                           Tiling(64, 64), "fa2_bwd_dkdv"))


def test_masked_iterations_take_the_masked_copys_instructions():
    """With the compile's masked loop count, the iterations the schedule marks masked take
    at least that many instructions at the pace, the others the main loop's."""
    from simulator.occupancy import CompiledResources

    h200 = load_hardware("h200-sxm")
    sched = build_schedule(AttentionProblem(1, 1, 512, 128, causal=True), Tiling(128, 128, 2, 8),
                           "fa2")
    (fwd,) = sched.kernels
    given = {"fa2_fwd": CompiledResources(255, 65536, loop_instructions=499,
                                          masked_loop_instructions=1006)}
    prog = kernel_program(fwd, sched, h200, compress=False, compiled=given)
    flags = fwd.masked_iterations()
    assert flags.sum() == 4 and flags.size == 1 + 2 + 3 + 4  # one diagonal block a CTA
    pace = 5.15 / 1.789e9
    assert np.all(prog.loop.path_s[flags] >= 1006 * pace * (1 - 1e-12))
    unmasked = kernel_program(fwd, sched, h200, compress=False, compiled={
        "fa2_fwd": CompiledResources(255, 65536, loop_instructions=499)})
    np.testing.assert_array_equal(prog.loop.path_s[~flags], unmasked.loop.path_s[~flags])
    assert np.all(unmasked.loop.path_s[flags] < 1006 * pace)
