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

    def spy(problem, tiling, schedule, hw, compiled=None, l2_start="cold"):
        seen.append(compiled)
        return {"time_s": 1.0}

    predict_record(spy, rec, H200)
    predict_record(spy, dict(rec, kernel_facts=None), H200)
    assert seen == [compiled_resources(rec), None]


def test_facts_of_a_kernel_the_schedule_does_not_launch_refuse_the_record():
    """Facts naming another schedule's kernel belong to another config: the record is not
    predicted with them, nor silently without them."""
    import pytest

    from traces.problem import ProblemError

    rec = {"problem": NAIVE.to_dict(), "tiling": TILING.to_dict(), "schedule": "naive",
           "kernel_facts": [{"name": "naive_qk", "registers": 60},
                            {"name": "fa2_fwd", "registers": 128}]}
    with pytest.raises(ProblemError, match="name fa2_fwd, which naive fwd does not launch "
                                           r"\(naive_pv, naive_qk, naive_softmax\)"):
        predict_record(lambda *a, **k: {"time_s": 1.0}, rec, H200)


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


def test_compiled_registers_are_allocated_in_units_of_eight():
    """100 registers per thread take 104 on the SM: 65536 / (104 x 128) = 4 CTAs, not 5."""
    from simulator.occupancy import residency
    from traces.schedules import build_schedule

    kernel = build_schedule(NAIVE, TILING, "naive").kernels[0]
    res = residency(kernel, TILING, 64, H200, registers_per_thread=100, smem_bytes=1000)
    assert (res.ctas_per_sm, res.limited_by, res.registers_per_thread) == (4, "registers",
                                                                           100)


def test_the_label_says_which_resources_were_compiled():
    from simulator.prediction import count_prediction

    def label(given):
        pred = count_prediction(NAIVE, TILING, "fa2", H200, {"fa2_fwd": given})
        return pred["kernels"][0]["resources"]

    assert label(CompiledResources(None, None)) == "estimated"
    assert label(CompiledResources(0, None)) == "estimated"  # 0 registers: no count
    assert label(CompiledResources(None, 40960)) == "compiled shared memory"
    assert label(CompiledResources(128, None)) == "compiled registers"
    assert label(CompiledResources(128, 40960)) == "compiled"


def test_zero_registers_is_no_count_everywhere():
    """A compile reporting 0 registers gives no count: the estimate stands, for residency
    called directly as for the compiled resources of a kernel."""
    from simulator.occupancy import kernel_residency, residency
    from traces.schedules import build_schedule

    kernel = build_schedule(NAIVE, TILING, "fa2").kernels[0]
    assert CompiledResources(0, 512).registers_per_thread is None
    estimated = residency(kernel, TILING, 64, H200)
    assert residency(kernel, TILING, 64, H200, registers_per_thread=0) == estimated
    assert kernel_residency(kernel, TILING, 64, H200,
                            {kernel.name: CompiledResources(0, None)}) == estimated


def test_facts_of_another_architecture_are_not_used():
    """A record's compile says nothing of another GPU: predicted on an A100 preset, an
    H200 record's facts are left out (the estimate stands)."""
    from simulator.hardware import load_hardware

    rec = {"problem": NAIVE.to_dict(), "tiling": TILING.to_dict(), "schedule": "naive",
           "environment": {"gpu_capability": "9.0"},
           "kernel_facts": [{"name": "naive_qk", "shared_bytes": 16384, "registers": 60}]}
    assert compiled_resources(rec, H200) == {"naive_qk": CompiledResources(60, 16384)}
    assert compiled_resources(rec, load_hardware("a100-sxm4-80gb")) is None


def test_compiled_registers_above_the_preset_cap_are_refused(monkeypatch):
    """A what-if that lowers max_registers_per_thread cannot keep a compile made for 255."""
    import pytest

    from kernels import resources
    from simulator.cli.resources_args import compile_resources
    from simulator.hardware import with_overrides
    from traces.problem import ProblemError

    row = resources.KernelResources(kernel="fa2_fwd", arch=90, dtype="bf16", head_dim=64,
                                    block_m=64, block_n=64, num_stages=2, num_warps=4,
                                    shared_bytes=40960, registers=200, spill_bytes=0)
    monkeypatch.setattr(resources, "schedule_resources",
                        lambda problem, tilings, names, arch, progress=None:
                        [{"fa2_fwd": row} for _ in tilings])
    capped = with_overrides(H200, ["max_registers_per_thread=128"])
    with pytest.raises(ProblemError, match="200 registers per thread, above"):
        compile_resources(NAIVE, [TILING], "fa2", capped)
    (ok,) = compile_resources(NAIVE, [TILING], "fa2", H200)
    assert ok == {"fa2_fwd": CompiledResources(200, 40960)}


def test_decode_reduce_compiles_with_the_rows_it_launches_with():
    """kernels.decode launches decode_reduce with BLOCK_Q = Nq padded (1 for decoding),
    whatever the group size; decode_split with the group's G*Nq rows (at least 16)."""
    from kernels.resources import constexprs

    assert constexprs("decode_reduce", 64, TILING, decode_rows=8, seq_q=1)["BLOCK_Q"] == 1
    assert constexprs("decode_reduce", 64, TILING, decode_rows=24, seq_q=3)["BLOCK_Q"] == 4
    assert constexprs("decode_split", 64, TILING, decode_rows=24, seq_q=3)["BLOCK_R"] == 32


def test_compare_takes_both_schedules_compiled_resources(capsys):
    import json

    import pytest

    pytest.importorskip("triton")
    argv = ["compare", "--hardware", "h200-sxm", "--heads", "2", "--seq", "256",
            "--head-dim", "64", "--block-m", "64", "--block-n", "64", "--compiled-resources",
            "--json"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    preds = json.loads(out)
    kernels = [k for name in ("naive", "fa2") for k in preds[name]["kernels"]]
    assert [k["name"] for k in kernels] == ["naive_qk", "naive_softmax", "naive_pv",
                                           "fa2_fwd"]
    assert all(k["resources"] == "compiled" for k in kernels)
    assert kernels[1]["registers_per_thread"] < 64 and kernels[1]["ctas_per_sm"] == 16


def test_a_broken_triton_is_one_line(monkeypatch):
    """Installed but failing to import (a CUDA mismatch, say): one clear line, no traceback."""
    import pytest

    pytest.importorskip("triton")
    from kernels import resources
    from simulator.cli.resources_args import compile_resources
    from traces.problem import ProblemError

    def broken(*args, **kwargs):
        raise ImportError("libcuda.so: cannot open shared object file", name="triton")

    monkeypatch.setattr(resources, "schedule_resources", broken)
    with pytest.raises(ProblemError, match="^--compiled-resources: cannot import triton: "
                                           "libcuda.so") as info:
        compile_resources(NAIVE, [TILING], "naive", H200)
    assert "\n" not in str(info.value)


def test_spilled_registers_take_the_l1_data_path_every_iteration():
    """A loop that spills ``s`` bytes per thread per iteration moves ``s x threads`` more
    bytes through the SM's L1 data path (the ``smem`` unit, at 128 B/clk) in every
    iteration, waits an L2 round trip more per iteration each time its warps wait for the
    reloads (and a loop that does not spill, none), nothing else changes, and the kernel
    gets slower; records carry the bytes as the device compile's loaded and stored spills,
    and the waits."""
    import dataclasses

    import numpy as np

    from simulator.sim.compute import UNITS
    from simulator.sim.program import schedule_programs
    from traces.schedules import build_schedule

    problem = AttentionProblem(batch=1, heads=8, seq_q=2048, head_dim=128)
    tiling = Tiling(128, 64, 2, 4)
    schedule = build_schedule(problem, tiling, "fa2")
    given = {"fa2_fwd": CompiledResources(255, 98304)}
    spilled = {"fa2_fwd": CompiledResources(255, 98304, spill_bytes_per_iteration=236,
                                            spill_store_bytes_per_iteration=12)}
    (plain,), (spill,) = (schedule_programs(schedule, H200, compiled=c)
                          for c in (given, spilled))
    smem = UNITS.index("smem")
    # at the clock the SMs run a kernel with matmuls at
    rate = H200.smem_bandwidth_bytes_per_clk_per_sm * H200.sm_clock_tensor_hz
    extra = spill.loop.unit_s[smem] - plain.loop.unit_s[smem]
    assert np.allclose(extra, 236 * tiling.threads / rate)
    others = [u for u in range(len(UNITS)) if u != smem]
    assert np.array_equal(spill.loop.unit_s[others], plain.loop.unit_s[others])
    assert np.array_equal(spill.pre.unit_s, plain.pre.unit_s)
    assert (spill.loop.compute_s > plain.loop.compute_s).all()
    # each wait for the reloads is an L2 round trip on the iteration's path: the compile's
    # count of them, one where only the bytes are known, none without spills
    counted = {"fa2_fwd": dataclasses.replace(spilled["fa2_fwd"], spill_reload_waits=5)}
    slower_l2 = dataclasses.replace(H200, l2_latency_s=H200.l2_latency_s + 1e-7)
    for compiled, waits in ((given, 0), (spilled, 1), (counted, 5)):
        (before,), (after,) = (schedule_programs(schedule, hw, compiled=compiled)
                               for hw in (H200, slower_l2))
        assert np.allclose(after.loop.path_s - before.loop.path_s, waits * 1e-7)
        assert np.array_equal(after.pre.path_s, before.pre.path_s)
        assert np.array_equal(after.loop.unit_s, before.loop.unit_s)
    (five,) = schedule_programs(schedule, H200, compiled=counted)
    assert np.allclose(five.loop.path_s - spill.loop.path_s, 4 * H200.l2_latency_s)
    slow, _ = predict(problem, tiling, "fa2", H200, compiled=spilled)
    fast, _ = predict(problem, tiling, "fa2", H200, compiled=given)
    assert slow["time_s"] > fast["time_s"]
    assert slow["bytes"]["global_read"] == fast["bytes"]["global_read"]
    assert slow["kernels"][0]["spill_bytes_per_iteration"] == 236
    assert fast["kernels"][0]["spill_bytes_per_iteration"] is None
    assert slow["kernels"][0]["spill_reload_waits"] is None
    slower, _ = predict(problem, tiling, "fa2", H200, compiled=counted)
    assert slower["time_s"] > slow["time_s"] and slower["kernels"][0]["spill_reload_waits"] == 5

    facts = [{"name": "fa2_fwd", "shared_bytes": 98304, "registers": 255,
              "spill_load_bytes_per_iteration": 224, "spill_store_bytes_per_iteration": 12}]
    rec = {"problem": problem.to_dict(), "tiling": tiling.to_dict(), "schedule": "fa2",
           "kernel_facts": facts}
    assert compiled_resources(rec) == spilled
    facts[0]["spill_reload_waits"] = 5
    assert compiled_resources(rec) == counted
    del facts[0]["spill_store_bytes_per_iteration"], facts[0]["spill_reload_waits"]
    assert compiled_resources(rec) == given
