"""Kernels and schedules are twins: what each kernel really loads and stores, per tensor,
equals the schedule's counted global traffic (docs/schedules.md).

The kernels run in Triton's CPU interpreter with every tl.load/tl.store counted
(kernels/footprint.py; masked-off elements excluded). They are compared with two
independent statements of the schedules: ``expected_traffic`` below, written from
docs/schedules.md alone, and ``traces.schedules.kernel_traffic``, the simulator's own
schedules (the second comparison is skipped until that function exists).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is defined

from collections import defaultdict  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.attention import attention  # noqa: E402
from kernels.footprint import count_traffic, interpreted  # noqa: E402
from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreted(), reason="needs Triton's interpreter "
                                "(kernels were defined before TRITON_INTERPRET=1 was set)")

# (algorithm, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, block_m, block_n, split)
CASES = [
    ("fa2", 1, 2, 1, 37, 53, 16, True, 16, 32, 1),  # partial tiles, GQA, diagonal blocks
    ("fa2", 2, 2, 2, 40, 24, 32, True, 32, 16, 1),  # Nq > Nkv: whole blocks skipped
    ("fa2", 1, 3, 1, 20, 33, 16, False, 16, 16, 1),
    ("naive", 1, 2, 1, 21, 35, 16, True, 16, 32, 1),
    ("naive", 1, 2, 2, 18, 16, 32, False, 32, 16, 1),
    ("fa1", 1, 2, 1, 37, 53, 16, True, 16, 32, 1),
    ("fa1", 2, 2, 2, 40, 24, 32, True, 32, 16, 1),
    ("fa1", 1, 3, 1, 20, 33, 16, False, 16, 16, 1),
    ("decode", 1, 4, 1, 1, 77, 16, False, 16, 16, 3),
    ("decode", 2, 4, 2, 5, 50, 32, True, 16, 16, 4),
    ("decode", 1, 2, 2, 6, 4, 16, True, 16, 16, 1),  # Nq > Nkv: rows that see no key
]
STATS = 4  # bytes per fp32 statistic (LSE, D, l, m, partial outputs)


def _cdiv(a, b):
    return -(-a // b)


def expected_traffic(alg, b, h, h_kv, n_q, n_kv, d, causal, bm, bn, split, s=2):
    """Per-kernel, per-tensor bytes read and written, from docs/schedules.md alone."""
    g, tr, tc, off = h // h_kv, _cdiv(n_q, bm), _cdiv(n_kv, bn), n_kv - n_q
    rows = [min(bm, n_q - i * bm) for i in range(tr)]
    cols = [min(bn, n_kv - j * bn) for j in range(tc)]

    def visible(i, j):
        return not causal or j * bn <= min((i + 1) * bm, n_q) - 1 + off

    kernels = []

    def kernel(name, grid):
        """Start a launch; returns add(tensor, read=bytes, write=bytes) for it."""
        traffic = defaultdict(lambda: [0, 0])
        kernels.append((name, grid, traffic))

        def add(tensor, read=0, write=0):
            traffic[tensor][0] += read
            traffic[tensor][1] += write

        return add

    bh, bkv = b * h, b * h_kv
    if alg == "fa2":
        add = kernel("fa2_fwd", tr * bh)
        for i in range(tr):
            add("q", read=bh * rows[i] * d * s)
            for j in range(tc):
                if visible(i, j):
                    add("k", read=bh * cols[j] * d * s)
                    add("v", read=bh * cols[j] * d * s)
            add("o", write=bh * rows[i] * d * s)
            add("lse", write=bh * rows[i] * STATS)
        add = kernel("fa2_bwd_preprocess", tr * bh)
        add("o", read=bh * n_q * d * s)
        add("do", read=bh * n_q * d * s)
        add("delta", write=bh * n_q * STATS)
        add = kernel("fa2_bwd_dkdv", tc * bkv)
        for j in range(tc):
            for t in ("k", "v"):
                add(t, read=bkv * cols[j] * d * s)
            for i in range(tr):
                if visible(i, j):
                    for t, size in (("q", d * s), ("do", d * s), ("lse", STATS), ("delta", STATS)):
                        add(t, read=bh * rows[i] * size)
            for t in ("dk", "dv"):
                add(t, write=bkv * cols[j] * d * s)
        add = kernel("fa2_bwd_dq", tr * bh)
        for i in range(tr):
            for t, size in (("q", d * s), ("do", d * s), ("lse", STATS), ("delta", STATS)):
                add(t, read=bh * rows[i] * size)
            for j in range(tc):
                if visible(i, j):
                    add("k", read=bh * cols[j] * d * s)
                    add("v", read=bh * cols[j] * d * s)
            add("dq", write=bh * rows[i] * d * s)
    elif alg == "fa1":
        add = kernel("fa1_fwd", bh)
        add("o", write=bh * n_q * d * s)
        add("l", write=bh * n_q * STATS)
        add("m", write=bh * n_q * STATS)
        for j in range(tc):
            add("k", read=bh * cols[j] * d * s)
            add("v", read=bh * cols[j] * d * s)
            for i in range(tr):
                if visible(i, j):
                    add("q", read=bh * rows[i] * d * s)
                    for t, size in (("o", d * s), ("l", STATS), ("m", STATS)):
                        add(t, read=bh * rows[i] * size, write=bh * rows[i] * size)
    elif alg == "naive":
        score = bh * n_q * n_kv * s  # one whole S-shaped tensor
        add = kernel("naive_qk", tc * tr * bh)
        add("q", read=tc * bh * n_q * d * s)
        add("k", read=tr * bh * n_kv * d * s)
        add("s", write=score)
        add = kernel("naive_softmax", n_q * bh)
        add("s", read=score)
        add("p", write=score)
        add = kernel("naive_pv", tr * bh)
        add("p", read=score)
        add("v", read=tr * bh * n_kv * d * s)
        add("o", write=bh * n_q * d * s)
        add = kernel("naive_bwd_dv", tc * bkv)
        add("p", read=score)
        add("do", read=tc * bh * n_q * d * s)
        add("dv", write=bkv * n_kv * d * s)
        add = kernel("naive_bwd_dp", tc * tr * bh)
        add("do", read=tc * bh * n_q * d * s)
        add("v", read=tr * bh * n_kv * d * s)
        add("dp", write=score)
        add = kernel("naive_bwd_ds", tr * bh)
        for t in ("do", "o"):
            add(t, read=bh * n_q * d * s)
        for t in ("p", "dp"):
            add(t, read=score)
        add("ds", write=score)
        add = kernel("naive_bwd_dq", tr * bh)
        add("ds", read=score)
        add("k", read=tr * bh * n_kv * d * s)
        add("dq", write=bh * n_q * d * s)
        add = kernel("naive_bwd_dk", tc * bkv)
        add("ds", read=score)
        add("q", read=tc * bh * n_q * d * s)
        add("dk", write=bkv * n_kv * d * s)
    else:  # decode
        chunk = _cdiv(tc, split)
        add = kernel("decode_split", split * bkv)
        for sp in range(split):
            add("q", read=bkv * g * n_q * d * s)
            for j in range(sp * chunk, min((sp + 1) * chunk, tc)):
                if not causal or j * bn <= n_q - 1 + off:
                    add("k", read=bkv * cols[j] * d * s)
                    add("v", read=bkv * cols[j] * d * s)
            add("o_partial", write=bkv * g * n_q * d * STATS)
            add("lse_partial", write=bkv * g * n_q * STATS)
        add = kernel("decode_reduce", bh)
        add("lse_partial", read=bh * split * n_q * STATS)
        add("o_partial", read=bh * split * n_q * d * STATS)
        add("o", write=bh * n_q * d * s)
    return [{"name": name, "grid": grid,
             "per_tensor": {t: {"global_read": r, "global_write": w}
                            for t, (r, w) in traffic.items()}}
            for name, grid, traffic in kernels]


def _normalise(launches):
    """(name, grid, {tensor: (read, write)}) with all-zero tensors left out."""
    out = []
    for launch in launches:
        per_tensor = {t: (v["global_read"], v["global_write"])
                      for t, v in launch["per_tensor"].items()
                      if v["global_read"] or v["global_write"]}
        out.append((launch["name"], launch["grid"], per_tensor))
    return out


def _measure(case, dtype=torch.float16):
    alg, b, h, h_kv, n_q, n_kv, d, causal, bm, bn, split = case
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=gen).to(dtype).requires_grad_()
               for shape in ((b, h, n_q, d), (b, h_kv, n_kv, d), (b, h_kv, n_kv, d)))
    tiling = Tiling(block_m=bm, block_n=bn, split_kv=split)
    with count_traffic() as launches:
        out = attention(q, k, v, causal=causal, tiling=tiling, algorithm=alg)
        if alg in ("fa2", "naive"):
            out.backward(torch.randn(out.shape, generator=gen).to(dtype))
    return _normalise(launches)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_traffic_matches_schedule(case):
    measured = _measure(case)
    expected = _normalise(expected_traffic(*case))
    assert [m[:2] for m in measured] == [e[:2] for e in expected], "kernels or grids differ"
    for (name, _, got), (_, _, want) in zip(measured, expected, strict=True):
        assert got == want, f"{name}: measured {got} != schedule {want}"


def test_bf16_traffic_counts_two_bytes():
    case = ("fa2", 1, 2, 1, 20, 33, 16, True, 16, 16, 1)
    assert _measure(case, torch.bfloat16) == _normalise(expected_traffic(*case))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_traffic_matches_simulator_schedules(case):
    schedules = pytest.importorskip("traces.schedules")
    if not hasattr(schedules, "kernel_traffic"):
        pytest.skip("traces.schedules.kernel_traffic is not written yet")
    alg, b, h, h_kv, n_q, n_kv, d, causal, bm, bn, split = case
    problem = AttentionProblem(batch=b, heads=h, kv_heads=h_kv, seq_q=n_q, seq_kv=n_kv,
                               head_dim=d, dtype="fp16", causal=causal,
                               pass_="fwd+bwd" if alg in ("fa2", "naive") else "fwd")
    tiling = Tiling(block_m=bm, block_n=bn, split_kv=split)
    assert _measure(case) == _normalise(schedules.kernel_traffic(problem, tiling, alg))
