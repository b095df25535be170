"""The shared memory an attention forward loop takes where no compile says
(``simulator.occupancy.triton_forward_shared_bytes``), against Triton's own compiles: every
FA2 forward row of tilesim's tables at d = 64 and 128 (Triton 3.6.0, no Triton needed
here), and fresh compiles of decode's split and of FA2's forward with the Triton installed
(the rule held under 3.6.0 and 3.9.0 alike). On sm_80 the rule differs (P) and is taken
for FA2's forward alone."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kernels import resources, table
from simulator.hardware import load_hardware
from simulator.occupancy import kernel_residency, triton_forward_shared_bytes
from simulator.sim.compute import uses_wgmma
from traces.problem import AttentionProblem
from traces.schedules import build_schedule
from traces.tiling import Tiling

H200 = load_hardware("h200-sxm")
A100 = load_hardware("a100-sxm4-80gb")
DECODE = AttentionProblem(16, 32, 1, 128, seq_kv=16384, kv_heads=8)


def _kernel(problem, tiling, schedule):
    return build_schedule(problem, tiling, schedule).kernels[0]


@pytest.mark.parametrize("hw", [H200, A100], ids=["sm_90", "sm_80"])
def test_every_fa2_forward_compile_of_the_table(hw):
    """d 64 and 128, causal or not, the sweep's tilings, at lengths on the multiples of 16
    (4096), off them (1000), and the keys' alone off them (4096 queries, 1000 keys): on
    sm_90 2,000 compiles at each without GQA (bf16 and fp16; fp16 takes the bf16 rows
    where the keys alone are off) and 1,000 with it (bf16), on sm_80 1,000 and 1,000
    (bf16; its table has no fp16 forward of its own). GQA and the lengths change the
    registers, not the tiles."""
    arch = hw.compute_capability
    if not table.current(arch):
        pytest.fail(f"the sm_{arch} table of compiles is stale: "
                    f"python -m kernels.table build --arch {arch}")
    dtypes = ("bf16", "fp16") if arch == 90 else ("bf16",)
    launches = [(dtype, 16) for dtype in dtypes] + [("bf16", 16 // table.GQA_GROUP)]
    compared = 0
    lengths = ((4096, 4096), (table.OFF_16_SEQ, table.OFF_16_SEQ), (4096, table.OFF_16_SEQ))
    for (seq_q, seq_kv), d, (dtype, kv_heads), causal in itertools.product(
            lengths, (64, 128), launches, (False, True)):
        problem = AttentionProblem(4, 16, seq_q, d, seq_kv=seq_kv, kv_heads=kv_heads,
                                   dtype=dtype, causal=causal)
        for tiling in table.sweep_space():
            row = table.problem_rows(problem, tiling, ["fa2_fwd"], arch).get("fa2_fwd")
            if row is None or row.get("shared_bytes") is None:
                continue
            kernel = _kernel(problem, tiling, "fa2")
            assert triton_forward_shared_bytes(kernel, tiling, hw) == row["shared_bytes"], (
                seq_q, seq_kv, d, dtype, causal, tiling)
            compared += 1
    assert compared == len(lengths) * 1000 * len(launches)


def test_by_hand():
    """d = 128, bf16. 128 x 64, 2 stages, 4 warps (wgmma): Q 32 KB and two buffers each of K
    and V, 16 KB a tile. 16 x 64, 3 stages (mma.sync): Q 4 KB, two buffers each of K and V,
    and P (16 x 64, 2 KB). One stage: Q and one buffer of the larger tile."""
    problem = AttentionProblem(4, 16, 4096, 128)
    cases = {Tiling(128, 64, 2, 4): 32768 + 4 * 16384,
             Tiling(16, 64, 3, 4): 4096 + 4 * 16384 + 2048,
             Tiling(128, 32, 1, 8): 32768 + 8192}
    for tiling, expected in cases.items():
        kernel = _kernel(problem, tiling, "fa2")
        assert triton_forward_shared_bytes(kernel, tiling, H200) == expected
    # decode's split: its group tile's 4 rows padded to the matmul's 16
    tiling = Tiling(16, 128, 2, 4, split_kv=2)
    split = _kernel(DECODE, tiling, "decode")
    assert triton_forward_shared_bytes(split, tiling, H200) == (
        16 * 128 * 2 + 2 * 32768 + 16 * 128 * 2)


def test_by_hand_on_sm_80():
    """mma.sync throughout: Q and num_stages - 1 buffers each of K and V (one buffer of
    the larger tile at one stage), and P only where the tile has fewer rows than the head
    dim. 64 x 64, 2 stages: d = 128, Q 16 KB, K and V 16 KB each, P 8 KB; d = 64, Q, K and
    V 8 KB each, no P."""
    cases = {(128, Tiling(64, 64, 2, 4)): 16384 + 2 * 16384 + 8192,
             (64, Tiling(64, 64, 2, 4)): 3 * 8192,
             (64, Tiling(128, 64, 3, 8)): 16384 + 2 * 2 * 8192,
             (128, Tiling(32, 128, 1, 4)): 8192 + 32768 + 8192}
    for (d, tiling), expected in cases.items():
        kernel = _kernel(AttentionProblem(4, 16, 4096, d), tiling, "fa2")
        assert triton_forward_shared_bytes(kernel, tiling, A100) == expected, (d, tiling)
        assert kernel_residency(kernel, tiling, d, A100).smem_per_cta_bytes == expected


def test_where_the_rule_is_not_taken():
    """Other kernels, and other architectures, keep the schedule's SRAM; on sm_80, decode's
    split and head dims other than 64 and 128 too."""
    tiling = Tiling(64, 64, 2, 4)
    problem = AttentionProblem(1, 2, 1024, 64, pass_="bwd")
    for kernel in build_schedule(problem, tiling, "fa2").kernels:
        assert triton_forward_shared_bytes(kernel, tiling, H200) is None
        assert triton_forward_shared_bytes(kernel, tiling, A100) is None
    forward = _kernel(AttentionProblem(1, 2, 1024, 64), tiling, "fa2")
    ada = load_hardware("rtx-4090")
    assert triton_forward_shared_bytes(forward, tiling, ada) is None
    assert kernel_residency(forward, tiling, 64, ada).smem_per_cta_bytes == forward.sram_bytes
    wide = _kernel(AttentionProblem(1, 2, 1024, 256), tiling, "fa2")
    assert triton_forward_shared_bytes(wide, tiling, A100) is None
    split = Tiling(16, 128, 2, 4, split_kv=2)
    assert triton_forward_shared_bytes(_kernel(DECODE, split, "decode"), split, A100) is None
    for dtype in ("fp32", "fp8"):  # no compile of ours bears the rule out for them
        other = _kernel(AttentionProblem(1, 2, 1024, 64, dtype=dtype), tiling, "fa2")
        assert triton_forward_shared_bytes(other, tiling, H200) is None
        assert triton_forward_shared_bytes(other, tiling, A100) is None


def test_residency_takes_it_and_a_compile_overrides_it():
    """decode at d = 128, 128-key blocks, 2 stages: 72 KB by the rule (3 CTAs an SM), 129 KB
    by the schedule (1 CTA); a compile's own number wins over both."""
    from simulator.occupancy import CompiledResources

    tiling = Tiling(16, 128, 2, 4, split_kv=2)
    split = _kernel(DECODE, tiling, "decode")
    res = kernel_residency(split, tiling, 128, H200)
    assert res.smem_per_cta_bytes == 73728 and split.sram_bytes == 132096
    assert res.ctas_per_sm == H200.smem_per_sm_bytes // (73728 + 1024) == 3
    given = {"decode_split": CompiledResources(None, 50000)}
    assert kernel_residency(split, tiling, 128, H200, given).smem_per_cta_bytes == 50000


def test_fresh_compiles_of_decode_and_the_forward():
    """With the Triton installed: decode's split (d 64 and 128, block_n 32 to 256, 1 to 3
    stages) and FA2's forward at mma.sync and wgmma tilings."""
    pytest.importorskip("triton")
    cases = [("decode", dataclasses.replace(DECODE, head_dim=d), Tiling(16, bn, st, 4, split_kv=4))
             for d, bn, st in [(64, 32, 1), (64, 256, 2), (128, 64, 3), (128, 128, 2)]]
    cases += [("fa2", AttentionProblem(4, 16, 4096, 64), t)
              for t in (Tiling(16, 32, 3, 4), Tiling(64, 64, 1, 8), Tiling(128, 32, 2, 8))]
    for schedule, problem, tiling in cases:
        kernel = _kernel(problem, tiling, schedule)
        (compiled,) = resources.measure([kernel.name], archs=(90,), dtype="bf16",
                                        head_dim=problem.head_dim, tilings=[tiling],
                                        **resources.problem_shape(problem))
        assert compiled.error is None, compiled.error
        wgmma = uses_wgmma(H200, kernel.mma_rows, tiling.num_warps)
        assert triton_forward_shared_bytes(kernel, tiling, H200) == compiled.shared_bytes, (
            schedule, tiling, wgmma)
    # and FA2's forward on sm_80, P in shared memory (block_m < head_dim) and not
    for d, tiling in ((128, Tiling(64, 64, 2, 4)), (64, Tiling(64, 128, 3, 8))):
        problem = AttentionProblem(4, 16, 4096, d)
        kernel = _kernel(problem, tiling, "fa2")
        (compiled,) = resources.measure(["fa2_fwd"], archs=(80,), dtype="bf16", head_dim=d,
                                        tilings=[tiling], **resources.problem_shape(problem))
        assert compiled.error is None, compiled.error
        assert triton_forward_shared_bytes(kernel, tiling, A100) == compiled.shared_bytes, (
            d, tiling)
