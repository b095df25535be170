"""Problem and tiling validation, and the FLOP convention."""

from __future__ import annotations

import pytest

from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling


def test_defaults_fill_kv_fields():
    p = AttentionProblem(batch=2, heads=8, seq_q=100, head_dim=64)
    assert p.seq_kv == 100 and p.kv_heads == 8 and p.group_size == 1
    assert p.causal_offset == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0), '"batch" must be a positive integer'),
    (dict(seq_q=-1), '"seq_q" must be a positive integer'),
    (dict(seq_kv=0), '"seq_kv" must be a positive integer'),
    (dict(head_dim=8), '"head_dim" must be in 16..256'),
    (dict(head_dim=512), '"head_dim" must be in 16..256'),
    (dict(kv_heads=3), '"kv_heads" (3) must divide "heads" (8)'),
    (dict(dtype="fp64"), '"dtype" must be one of'),
    (dict(pass_="both"), '"pass" must be one of'),
    (dict(batch=True), '"batch" must be a positive integer'),
])
def test_problem_rejects(kwargs, message):
    args = dict(batch=1, heads=8, seq_q=128, head_dim=64) | kwargs
    with pytest.raises(ProblemError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AttentionProblem(**args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_m=48), "power of two"),
    (dict(block_n=8), "power of two >= 16"),
    (dict(block_m=512), "<= 256"),
    (dict(num_stages=0), "num_stages"),
    (dict(num_warps=3), "num_warps"),
    (dict(split_kv=0), "split_kv"),
    (dict(num_warps=4.0), "num_warps"),
    (dict(num_warps=True), "num_warps"),
    (dict(num_stages=True), "num_stages"),
    (dict(split_kv=2.0), "split_kv"),
])
def test_tiling_rejects(kwargs, message):
    with pytest.raises(ProblemError, match=message):
        Tiling(**kwargs)


def test_convention_flops():
    p = AttentionProblem(batch=2, heads=3, seq_q=100, seq_kv=50, head_dim=64)
    assert p.convention_flops() == 4 * 2 * 3 * 100 * 50 * 64
    square = AttentionProblem(batch=2, heads=3, seq_q=100, head_dim=64)
    causal_square = AttentionProblem(batch=2, heads=3, seq_q=100, head_dim=64, causal=True)
    assert causal_square.convention_flops() * 2 == square.convention_flops()
    bwd = AttentionProblem(batch=2, heads=3, seq_q=100, seq_kv=50, head_dim=64, pass_="bwd")
    both = AttentionProblem(batch=2, heads=3, seq_q=100, seq_kv=50, head_dim=64,
                            pass_="fwd+bwd")
    assert bwd.convention_flops() * 2 == 5 * p.convention_flops()
    assert both.convention_flops() * 2 == 7 * p.convention_flops()


def _unmasked_pairs(nq: int, nkv: int) -> int:
    """Query-key pairs a bottom-right causal mask keeps, row by row."""
    return sum(max(0, min(nkv, i + nkv - nq + 1)) for i in range(nq))


@pytest.mark.parametrize("nq, nkv", [(4096, 1024), (1024, 4096), (1, 4096), (3000, 1000)])
def test_causal_convention_counts_the_unmasked_area(nq, nkv):
    """Causal with Nq != Nkv: the unmasked area, within one row or column of the exact
    count of kept pairs (never half of Nq·Nkv, which rates 16k x 4k causal at twice the
    chip's peak)."""
    p = AttentionProblem(batch=1, heads=1, seq_q=nq, seq_kv=nkv, head_dim=64, causal=True)
    pairs = p.convention_flops() / (4 * 64)
    exact = _unmasked_pairs(nq, nkv)
    assert exact - min(nq, nkv) <= pairs <= exact
    assert pairs != nq * nkv / 2


def test_round_trip_dicts():
    p = AttentionProblem(1, 8, 64, 32, seq_kv=80, kv_heads=2, dtype="fp16", causal=True,
                         pass_="fwd+bwd")
    assert AttentionProblem.from_dict(p.to_dict()) == p
    assert p.to_dict()["pass"] == "fwd+bwd"
    t = Tiling(64, 32, 3, 8, 1)
    assert Tiling.from_dict(t.to_dict()) == t
