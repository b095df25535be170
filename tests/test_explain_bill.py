"""The N^2 bill: exact byte and FLOP counts from the formulas, checked against literals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.explain.bill import bill, bill_row
from traces.problem import DTYPE_BYTES, ProblemError


def test_literal_numbers_n512_d128_fp16():
    row = bill([512], head_dim=128, dtype="fp16")["rows"][0]
    assert row["s_bytes"] == 1_048_576  # 2 * 512^2 * 2 B = 1 MiB: S written + read back
    assert row["sp_bytes"] == 2_097_152  # S written, read; P written, read
    assert row["flops"] == 134_217_728  # 4 * 512^2 * 128
    assert row["qkvo_bytes"] == 524_288  # 4 * 512 * 128 * 2
    assert row["s_bytes_per_flop"] == pytest.approx(2 / 256, rel=1e-15)
    assert row["s_over_qkvo"] == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize("dtype", sorted(DTYPE_BYTES))
def test_bytes_are_2_n2_s_per_head(dtype):
    s = DTYPE_BYTES[dtype]
    seqs = [512, 2048, 8192, 32768]
    result = bill(seqs, head_dim=128, dtype=dtype)
    assert result["elem_bytes"] == s
    for seq, row in zip(seqs, result["rows"], strict=True):
        assert row["seq"] == seq
        assert row["s_bytes"] == 2 * seq * seq * s
        assert row["sp_bytes"] == 4 * seq * seq * s
        assert row["flops"] == 4 * seq * seq * 128
        assert row["qkvo_bytes"] == 4 * seq * 128 * s
        assert isinstance(row["s_bytes"], int) and isinstance(row["flops"], int)


@given(seq=st.integers(1, 1 << 20), head_dim=st.integers(16, 256),
       elem_bytes=st.sampled_from([1, 2, 4]))
def test_ratios(seq, head_dim, elem_bytes):
    row = bill_row(seq, head_dim, elem_bytes)
    # Per FLOP the score bill does not depend on N; against Q,K,V,O it grows as N/(2d).
    assert row["s_bytes_per_flop"] == pytest.approx(elem_bytes / (2 * head_dim), rel=1e-12)
    assert row["sp_bytes_per_flop"] == pytest.approx(elem_bytes / head_dim, rel=1e-12)
    assert row["s_over_qkvo"] == pytest.approx(seq / (2 * head_dim), rel=1e-12)
    assert row["tiled_flop_per_byte"] == pytest.approx(seq / elem_bytes, rel=1e-12)
    assert row["naive_flop_per_byte"] < row["tiled_flop_per_byte"]


@pytest.mark.parametrize("kwargs", [
    {"seqs": [0]}, {"seqs": [512, -1]}, {"seqs": [512], "head_dim": 8},
    {"seqs": [512], "dtype": "fp64"},
])
def test_bad_input(kwargs):
    with pytest.raises(ProblemError):
        bill(**kwargs)


def test_plot_png_and_svg(tmp_path):
    result = bill([512, 2048], head_dim=64, dtype="bf16")
    from simulator.explain.bill import plot

    plot(result, tmp_path / "bill.png")
    plot(result, tmp_path / "bill.svg")
    assert (tmp_path / "bill.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "bill.svg").read_bytes()[:1000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bill.png", "bill.svg"]  # no temps
