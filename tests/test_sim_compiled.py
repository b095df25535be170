"""The compiler's registers and shared memory, where known, set a kernel's occupancy."""

from __future__ import annotations

from simulator.hardware import load_hardware
from simulator.occupancy import CompiledResources
from simulator.sim import predict
from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation.predict import compiled_resources, predict_record

H200 = load_hardware("h200-sxm")
NAIVE = AttentionProblem(batch=1, heads=4, seq_q=1024, head_dim=64)
TILING = Tiling(64, 64, 2, 4)


def test_compiled_registers_replace_the_estimate():
    """naive_softmax keeps one row in registers: compiled at 22 per thread (sm_90, Triton
    3.9) it runs 16 CTAs of 128 threads per SM (the thread limit), where the estimate's
    112 registers allow 4."""
    est, _ = predict(NAIVE, TILING, "naive", H200)
    compiled = {"naive_softmax": CompiledResources(registers_per_thread=22, shared_bytes=16)}
    real, _ = predict(NAIVE, TILING, "naive", H200, compiled=compiled)
    e, r = est["kernels"][1], real["kernels"][1]
    assert e["name"] == r["name"] == "naive_softmax"
    assert (e["ctas_per_sm"], e["registers_per_thread"], e["resources"]) == (4, 112,
                                                                          "estimated")
    assert (r["ctas_per_sm"], r["registers_per_thread"], r["resources"]) == (16, 22,
                                                                          "compiled")
    assert r["residency_limited_by"] == "threads" and r["sram_bytes_per_cta"] == 16
    assert real["kernels"][0] == est["kernels"][0]  # naive_qk: not given, estimated as before
    assert real["bytes"]["global_read"] == est["bytes"]["global_read"]  # same traffic
    assert r["time_s"] < e["time_s"]  # four times the CTAs hide more of the latency


def test_records_are_predicted_with_their_kernel_facts():
    facts = [{"name": "naive_qk", "shared_bytes": 16384, "registers": 60, "spill_bytes": 0},
             {"name": "naive_softmax", "shared_bytes": 16, "registers": None},
             {"name": "naive_pv", "shared_bytes": None, "registers": None}]
    rec = {"problem": NAIVE.to_dict(), "tiling": TILING.to_dict(), "schedule": "naive",
           "kernel_facts": facts}
    assert compiled_resources(rec) == {"naive_qk": CompiledResources(60, 16384),
                                       "naive_softmax": CompiledResources(None, 16)}
    assert compiled_resources(dict(rec, kernel_facts=None)) is None
    seen = []

    def spy(problem, tiling, schedule, hw, compiled=None):
        seen.append(compiled)
        return {"time_s": 1.0}

    predict_record(spy, rec, H200)
    predict_record(spy, dict(rec, kernel_facts=None), H200)
    assert seen == [compiled_resources(rec), None]


def _cli(argv, capsys):
    import simulator.cli as cli

    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_compiles_the_kernels_for_their_resources(capsys):
    """``--compiled-resources``: the schedule's twins compiled for sm_90 (no GPU needed),
    their registers and shared memory are the occupancy's; the same numbers as ``tilesim
    kernels resources`` gives for them."""
    import json

    import pytest

    pytest.importorskip("triton")
    from kernels.resources import schedule_resources
    from simulator.occupancy import residency
    from traces.schedules import build_schedule

    argv = ["count", "--hardware", "h200-sxm", "--schedule", "naive", "--heads", "4",
            "--seq", "1024", "--head-dim", "64", "--block-m", "64", "--block-n", "64",
            "--compiled-resources", "--json"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    kernels = json.loads(out)["kernels"]
    (rows,) = schedule_resources(NAIVE, [TILING], [k["name"] for k in kernels], 90)
    sched = build_schedule(NAIVE, TILING, "naive")
    for k, kernel in zip(kernels, sched.kernels, strict=True):
        row = rows[k["name"]]
        assert k["resources"] == "compiled"
        assert (k["registers_per_thread"], k["sram_bytes_per_cta"]) == (row.registers,
                                                                         row.shared_bytes)
        res = residency(kernel, TILING, 64, H200, row.registers, row.shared_bytes)
        assert k["ctas_per_sm"] == res.ctas_per_sm
    assert kernels[1]["registers_per_thread"] < 64  # the softmax row: far below the rule


def test_cli_refuses_what_does_not_compile(capsys):
    import pytest

    pytest.importorskip("triton")
    for extra, words in ((["--dtype", "fp8"], "not fp8"), (["--head-dim", "80"], "not 80"),
                         (["--set", "compute_capability=100"], "sm_80 or sm_90")):
        code, _, err = _cli(["count", "--seq", "256", "--heads", "1", "--compiled-resources",
                             *extra], capsys)
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_sweep_rates_every_tiling_with_its_compiled_resources(capsys):
    """``sweep --compiled-resources``: legality and occupancy of each candidate from its own
    compile (d = 128, 4 stages at BN = 128 needs more shared memory than an SM has)."""
    import json

    import pytest

    pytest.importorskip("triton")
    from kernels.resources import schedule_resources
    from simulator.occupancy import residency
    from traces.schedules import build_schedule

    problem = AttentionProblem(batch=1, heads=2, seq_q=512, head_dim=128)
    argv = ["sweep", "--hardware", "h200-sxm", "--heads", "2", "--seq", "512",
            "--head-dim", "128", "--block-m", "128", "--block-n", "64,128",
            "--stages", "2,4", "--warps", "8", "--jobs", "1", "--compiled-resources",
            "--json"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    doc = json.loads(out)
    tilings = [Tiling(128, bn, st, 8) for bn in (64, 128) for st in (2, 4)]
    compiled = schedule_resources(problem, tilings, ["fa2_fwd"], 90)
    expected = {}
    for tiling, rows in zip(tilings, compiled, strict=True):
        row = rows["fa2_fwd"]
        kernel = build_schedule(problem, tiling, "fa2").kernels[0]
        res = residency(kernel, tiling, 128, H200, row.registers, row.shared_bytes)
        if res.ctas_per_sm:
            expected[(tiling.block_n, tiling.num_stages)] = (res.ctas_per_sm,
                                                             row.shared_bytes)
    got = {(r["tiling"]["block_n"], r["tiling"]["num_stages"]):
           (r["kernels"][0]["ctas_per_sm"], r["kernels"][0]["sram_bytes_per_cta"])
           for r in doc["results"]}
    assert got == expected
    assert all(r["kernels"][0]["resources"] == "compiled" for r in doc["results"])
    assert sum(doc["refused"].values()) == len(tilings) - len(expected) > 0
