"""The calls validation times, on the CPU: kernel names (what ncu matches on) and correctness.

The Triton interpreter runs the kernels here (``TRITON_INTERPRET=1``, see conftest.py), on
problems small enough to keep the suite fast.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from traces.problem import AttentionProblem  # noqa: E402
from traces.tiling import Tiling  # noqa: E402
from validation import workloads  # noqa: E402
from validation.compile import capture_launches, compile_tasks, setup_launches  # noqa: E402
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
    assert len(tasks) == 2 and all(t[1]["batch"] == 1 for t in tasks)


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
