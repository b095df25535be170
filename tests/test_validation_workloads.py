"""The calls validation times, on the CPU: kernel names (what ncu matches on) and correctness.

The Triton interpreter runs the kernels here (``TRITON_INTERPRET=1``, see conftest.py), on
problems small enough to keep the suite fast.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation import workloads  # noqa: E402
from validation.compile import (  # noqa: E402
    capture_launches,
    compile_tasks,
    kernel_facts,
    launch_key,
    setup_launches,
)
from validation.correctness import ReferenceCache, check, checked_groups  # noqa: E402
from validation.matrix import kernel_names  # noqa: E402

CASES = [
    ("fa2", AttentionProblem(batch=2, heads=16, seq_q=4096, head_dim=128, causal=True),
     Tiling(block_m=128, block_n=64, num_stages=3, num_warps=8)),
    ("fa2", AttentionProblem(batch=1, heads=16, seq_q=2048, head_dim=64, pass_="bwd"),
     Tiling(block_m=64, block_n=64)),
    ("naive", AttentionProblem(batch=1, heads=16, seq_q=2048, head_dim=64),
     Tiling(block_m=64, block_n=64)),
    ("decode", AttentionProblem(batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=4096,
                                head_dim=128), Tiling(block_m=16, block_n=64, split_kv=8)),
]


@pytest.mark.parametrize("schedule,problem,tiling", CASES,
                         ids=[f"{c[0]}-{c[1].pass_}" for c in CASES])
def test_launched_kernels_are_the_schedules(schedule, problem, tiling):
    launches = capture_launches(schedule, problem, tiling)  # intercepted: nothing runs
    assert [launch.name for launch in launches] == kernel_names(schedule, problem, tiling)
    if problem.pass_ == "bwd":
        fwd = AttentionProblem.from_dict(dict(problem.to_dict(), **{"pass": "fwd"}))
        assert [launch.name for launch in setup_launches(schedule, problem)] == kernel_names(
            schedule, fwd, Tiling())


def test_compile_tasks_dedupe_by_key():
    cfgs = [{"compile_key": k, "schedule": "fa2", "problem": {"batch": 8}, "tiling": {}}
            for k in ("a", "b", "a")]
    tasks = compile_tasks(cfgs)
    assert [t[1] for t in tasks] == ["a", "b"] and all(t[2]["batch"] == 1 for t in tasks)


def test_configs_that_triton_specializes_apart_are_compiled_apart():
    """Decode at N = 1k with 32-key blocks: 32 splits leave a chunk of one block (a
    constexpr), 16 splits chunks of two; one compile key, two compiles, each config's
    facts its own. FA2 at N = 2k and 4k (multiples of 16 both) share one."""
    from validation import matrix

    def config(schedule, problem, tiling):
        return {"schedule": schedule, "problem": problem.to_dict(), "tiling": tiling.to_dict(),
                "kernels": kernel_names(schedule, problem, tiling),
                "compile_key": matrix.compile_key(schedule, problem, tiling)}

    decode = AttentionProblem(batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=1024,
                              head_dim=128)
    one, two = (config("decode", decode, Tiling(16, 32, 2, 4, split)) for split in (32, 16))
    assert one["compile_key"] == two["compile_key"]
    split_one, reduce_one = launch_key(one).split("|")[1:]  # the two kernels' job keys
    split_two, reduce_two = launch_key(two).split("|")[1:]
    assert split_one.startswith("decode_split/90/bf16/") and '"chunk": 1' in split_one
    assert '"chunk"' not in split_two  # a chunk of 2: no constexpr
    assert all('"n_q": 1' in key for key in (split_one, split_two, reduce_one, reduce_two))
    assert split_one.endswith("/n_kv,n_split") and split_two.endswith("/n_kv,n_split")
    assert reduce_one == reduce_two and reduce_one.endswith("/n_heads,n_split")
    assert [t[1] for t in compile_tasks([one, two, one])] == [launch_key(one), launch_key(two)]
    fa2 = [config("fa2", AttentionProblem(batch=1, heads=16, seq_q=n, head_dim=64),
                  Tiling(64, 64, 2, 4)) for n in (2048, 4096)]
    assert len({launch_key(c) for c in fa2}) == len(compile_tasks(fa2)) == 1


def test_kernel_facts_read_the_compiled_kernel():
    """What the device run keeps of each compiled kernel: shared memory and the wgmma
    operand demand of its PTX (the parser itself is checked in test_kernels_aot)."""
    ptx = ("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, 0, 1, "
           "1, 0, 0;")
    ttgir = ("#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], "
             "instrShape = [16, 16, 16]}>\n"
             "%qk = ttng.warp_group_dot %q, %k, %c : !ttg.memdesc<64x16xbf16> * "
             "!ttg.memdesc<16x16xbf16> -> tensor<64x16xf32, #mma> loc(#loc1)")
    compiled = types.SimpleNamespace(asm={"ptx": ptx, "ttgir": ttgir},
                                     metadata=types.SimpleNamespace(shared=49152))
    facts = kernel_facts("fa2_fwd", compiled)
    per_flop = (64 * 16 * 2 + 16 * 16 * 2) / (2 * 64 * 16 * 16)
    assert facts == {"name": "fa2_fwd", "shared_bytes": 49152,
                     "registers": None, "spill_bytes": None,  # no cubin to read
                     "wgmma_smem_bytes_per_flop": pytest.approx(per_flop),
                     "wgmma_smem_bytes_per_flop_max": pytest.approx(per_flop),
                     "mma_layouts": "64x16:4x1", "loads_in_flight": None,
                     "loads_issued_after_compute": None,  # no loop in this TTGIR
                     "loop_instructions": None, "spill_load_bytes_per_iteration": None,
                     "spill_store_bytes_per_iteration": None,
                     "spill_reload_waits": None,
                     "straight_instructions": None,  # no SASS without a cubin
                     "prologue_instructions": None, "epilogue_instructions": None,
                     "masked_loop_instructions": None}
    no_wgmma = types.SimpleNamespace(asm={"ptx": "mma.sync"},
                                     metadata=types.SimpleNamespace(shared=0))
    assert kernel_facts("decode_split", no_wgmma)["wgmma_smem_bytes_per_flop"] is None
    broken = types.SimpleNamespace(asm={"ptx": "", "cubin": b"not a cubin"},
                                   metadata=types.SimpleNamespace(shared=0))
    facts = kernel_facts("naive_softmax", broken)  # cuobjdump fails: facts left out, no error
    assert facts["registers"] is None and facts["spill_bytes"] is None
    assert facts["loop_instructions"] is None and facts["spill_reload_waits"] is None


def test_kernel_facts_read_registers_from_a_real_cubin():
    """On a real sm_90 compile (ahead of time, no GPU; outside the interpreter, in a
    process of its own) the facts carry the registers the cubin declares and its main
    loop (instructions, spills, waits for them): what ``tilesim kernels resources``
    reports for the same kernel; FA2's forward at d = 128, 128 x 64, 4 warps spills in its
    loop, as the H200 records show (``tests/test_kernels_aot.py``)."""
    pytest.importorskip("triton")
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json\n"
        "from kernels.resources import compile_ahead, compile_one\n"
        "from traces.tiling import Tiling\n"
        "from validation.compile import kernel_facts\n"
        "t = Tiling(128, 64, 2, 4)\n"
        "row = compile_one('fa2_fwd', 90, 'bf16', 128, t)\n"
        "c = compile_ahead('fa2_fwd', 90, 'bf16', 128, t)\n"
        "print(json.dumps([row.to_dict(), kernel_facts('fa2_fwd', c)]))\n")
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    row, facts = json.loads(out.strip().splitlines()[-1])
    assert 0 < facts["registers"] <= 255
    for key in ("registers", "spill_bytes", "loop_instructions",
                "spill_load_bytes_per_iteration", "spill_store_bytes_per_iteration",
                "spill_reload_waits"):
        assert facts[key] == row[key], key
    assert facts["spill_load_bytes_per_iteration"] > 0 and facts["spill_reload_waits"] > 0


def test_precompile_worker_keeps_the_facts_of_the_configs_own_kernels(monkeypatch):
    """``_warm`` (the device run's compile worker, which needs a GPU to compile for) with
    SYNTHETIC launches: every launch is warmed, the facts are the config's own kernels'
    (not the backward's set-up forward), and facts that cannot be read cost nothing."""
    from validation import compile as comp

    def launch(name, ptx):
        compiled = types.SimpleNamespace(asm={"ptx": ptx},
                                         metadata=types.SimpleNamespace(shared=1024))

        def warmup(*args, **kwargs):
            warmed.append(name)
            return compiled

        fn = types.SimpleNamespace(warmup=warmup, fn=types.SimpleNamespace(__name__=name))
        return comp.Launch(fn, (1,), (), {})

    warmed: list[str] = []
    monkeypatch.setattr(comp, "capture_launches", lambda *a: [launch("fa2_bwd_dq", "")])
    monkeypatch.setattr(comp, "setup_launches", lambda *a: [launch("fa2_fwd", "")])
    bwd = AttentionProblem(batch=1, heads=2, seq_q=64, head_dim=16, pass_="bwd")
    task = ("fa2", "key", bwd.to_dict(), Tiling(block_m=16, block_n=16).to_dict())
    schedule, key, _, error, facts = comp._warm(task)
    assert (schedule, key, error) == ("fa2", "key", None)
    assert warmed == ["fa2_bwd_dq", "fa2_fwd"]
    assert [f["name"] for f in facts] == ["fa2_bwd_dq"] and facts[0]["shared_bytes"] == 1024
    monkeypatch.setattr(comp, "kernel_facts", lambda *a: 1 / 0)
    assert comp._warm(task)[3:] == (None, [])


def test_checked_groups():
    assert checked_groups(AttentionProblem(batch=1, heads=2, seq_q=8, head_dim=16)) == [
        (0, 0), (0, 1)]
    assert checked_groups(AttentionProblem(batch=3, heads=8, kv_heads=2, seq_q=1, seq_kv=64,
                                           head_dim=16)) == [(0, 0), (2, 1)]


SMALL = [
    ("fa2", AttentionProblem(batch=1, heads=2, seq_q=64, head_dim=16, causal=True),
     Tiling(block_m=16, block_n=16)),
    ("fa2", AttentionProblem(batch=1, heads=2, seq_q=32, head_dim=16, pass_="bwd"),
     Tiling(block_m=16, block_n=16)),
    ("decode", AttentionProblem(batch=2, heads=4, kv_heads=2, seq_q=1, seq_kv=64,
                                head_dim=16), Tiling(block_m=16, block_n=16, split_kv=2)),
]


@pytest.mark.parametrize("schedule,problem,tiling", SMALL,
                         ids=[f"{c[0]}-{c[1].pass_}" for c in SMALL])
def test_correctness_check_passes_on_the_interpreted_kernels(schedule, problem, tiling):
    inputs = workloads.make_inputs(problem, "cpu")
    if problem.pass_ == "bwd":
        workloads.setup_backward(schedule, problem, inputs)
    outputs = workloads.kernel_call(schedule, problem, tiling, inputs)()
    result = check(problem, outputs, ReferenceCache(problem, inputs))
    assert result["ok"], result
    assert set(result["outputs"]) == ({"o"} if problem.pass_ == "fwd" else {"dq", "dk", "dv"})
    for out in result["outputs"].values():
        assert out["max_abs_error"] <= 2 * out["pytorch_max_abs_error"]


def test_correctness_check_catches_a_wrong_output():
    problem = AttentionProblem(batch=1, heads=2, seq_q=32, head_dim=16)
    inputs = workloads.make_inputs(problem, "cpu")
    refs = ReferenceCache(problem, inputs)
    good = refs.get(0, 1)[0]["o"].to(torch.bfloat16)
    wrong = torch.zeros(1, 2, 32, 16, dtype=torch.bfloat16)
    wrong[:, 1:] = good
    wrong[0, 0, 5, 3] = 1.0  # head 0: zeros and one stray value
    result = check(problem, {"o": wrong}, refs)
    assert not result["ok"] and "exceeds" in result["reason"]
    nan = wrong.clone()
    nan[0, 1, 0, 0] = float("nan")
    assert "non-finite" in check(problem, {"o": nan}, refs)["reason"]
