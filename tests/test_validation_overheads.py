"""The overheads probe (validation/overheads.py): its arithmetic, its file, its CPU rehearsal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traces.problem import AttentionProblem
from traces.tiling import Tiling
from validation import ctas_per_sm, overhead_calls, overheads, overheads_summary

REPO = Path(__file__).resolve().parents[1]


def _rows(call, medians_s, error=None):
    base = {"schema": overheads.SCHEMA, "call": call, "detail": {}, "dry_run": False}
    if error:
        return [dict(base, mode=None, error=error)]
    return [dict(base, mode=m, median_s=t, p20_s=t, p80_s=t, n=10)
            for m, t in medians_s.items()]


def test_summary_differences_by_hand():
    rows = (_rows("empty", {"dirty": 6e-6, "clean": 5.5e-6, "warm": 5e-6, "do_bench": 6.5e-6})
            + _rows("empty_x2", {"dirty": 9e-6, "clean": 8.5e-6, "warm": 8.25e-6})
            + _rows("read_64mb", {"dirty": 30e-6, "clean": 21e-6, "warm": 4e-6})
            + _rows("dec", {"dirty": 40e-6, "warm": 30e-6})
            + _rows("dec_split", {"dirty": 30e-6, "warm": 22e-6})
            + _rows("dec_reduce", {"dirty": 4e-6, "warm": 3e-6})
            + _rows("decode", {}, error="RuntimeError: out of memory"))
    by = {e["call"]: e for e in overheads_summary.summary(rows)}
    assert by["empty"]["writeback_us"] == pytest.approx(0.5)
    assert by["empty"]["flush_us"] == pytest.approx(0.5)
    assert by["empty"]["do_bench_vs_dirty_us"] == pytest.approx(0.5)
    assert by["empty_x2"]["launch_gap_us"] == pytest.approx(3.25)  # 8.25 - 5.0
    assert by["empty_x2"]["do_bench_vs_dirty_us"] is None  # no do_bench row
    assert by["read_64mb"]["writeback_us"] == pytest.approx(9.0)
    assert by["read_64mb"]["flush_us"] == pytest.approx(17.0)
    assert by["decode"]["error"].startswith("RuntimeError")
    assert by["decode"]["writeback_us"] is None
    assert "launch_gap_us" not in by["empty"]
    assert by["dec"]["between_us"] == pytest.approx({"dirty": 6.0, "warm": 5.0})
    assert "between_us" not in by["dec_split"] and "between_us" not in by["empty"]
    table = overheads_summary.format_table(list(by.values()))
    assert "launch gap (empty_x2 - empty, warm): 3.25 us" in table
    assert "decode" in table and "failed: RuntimeError" in table
    assert "whole - split - reduce: dirty 6.0, warm 5.0 us" in table


def test_load_names_the_bad_line(tmp_path):
    path = tmp_path / "o.jsonl"
    good = json.dumps(_rows("empty", {"warm": 5e-6})[0])
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"o.jsonl:2: not JSON"):
        overheads_summary.load(str(path))
    path.write_text(good + "\n" + json.dumps({"schema": "tilesim.record/1"}) + "\n")
    with pytest.raises(ValueError, match=r"o.jsonl:2: not a tilesim.overheads/1 row"):
        overheads_summary.load(str(path))
    path.write_text(good + "\n\n")
    assert len(overheads_summary.load(str(path))) == 1


def _module(args, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-m", "validation.overheads", *args], cwd=REPO,
                          env=full, capture_output=True, text=True, timeout=300)


def test_summary_of_a_corrupt_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text("{oops\n")
    done = _module(["summary", str(path)])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "o.jsonl:1: not JSON" in done.stderr
    done = _module(["summary", str(tmp_path / "missing.jsonl")])
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_run_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    done = _module(["run", "--out", str(tmp_path / "o.jsonl")])
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_dry_run_times_every_mode_but_do_bench(tmp_path):
    """The CPU rehearsal builds and times the real calls (an empty Triton kernel, a read,
    decode's two kernels through the interpreter) at tiny sizes, one line per call and mode."""
    pytest.importorskip("torch")
    out = tmp_path / "o.jsonl"
    names = ["empty", "empty_x2", "chase_4mb", "mma_chain_m64_k64_w4", "read_16mb",
             "decode_k1024_n128_sp2", "decode_k1024_n128_sp2_split",
             "decode_k1024_n128_sp2_reduce"]
    done = _module(["run", "--out", str(out), "--dry-run", "--only", *names],
                   TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = overheads_summary.load(str(out))
    assert [(r["call"], r["mode"]) for r in rows] == [
        (n, m) for n in names for m in ("dirty", "clean", "warm")]
    for r in rows:
        assert r["dry_run"] is True and r["n"] == 3 and "error" not in r
        assert 0 < r["p20_s"] <= r["median_s"] <= r["p80_s"]
        assert r["detail"]["note"].startswith("dry run")
    summary = {e["call"]: e for e in overheads_summary.summary(rows)}
    assert summary["empty_x2"]["launch_gap_us"] is not None
    assert isinstance(summary["decode_k1024_n128_sp2"]["writeback_us"], float)
    assert set(summary["decode_k1024_n128_sp2"]["between_us"]) == {"dirty", "clean", "warm"}
    for chain in ("chase_4mb", "mma_chain_m64_k64_w4"):
        chase = summary[chain]
        assert chase["per_step_ns"]["warm"] == pytest.approx(
            chase["median_us"]["warm"] * 1e3 / overhead_calls.DRY_STEPS)


def test_probe_calls_match_the_records_they_explain():
    """The decode and FA2 calls are configs of the default matrix's records, so that their
    times can be set beside the records' (problem and tiling as the records write them)."""
    records = [json.loads(line) for line in
               (REPO / "validation/records/h200-default-2026-11-30.jsonl").open()]
    measured = {(json.dumps(r["problem"], sort_keys=True), json.dumps(r["tiling"], sort_keys=True))
                for r in records if r["implementation"] == "triton"}
    kernel_calls = [c for c in overhead_calls.calls() if "schedule" in c.detail]
    assert len([c for c in kernel_calls if "kernel" not in c.detail]) == 5
    assert len(kernel_calls) == 11  # and three decode configs' kernels one by one
    for c in kernel_calls:
        problem = {("pass" if k == "pass_" else k): v for k, v in c.detail["problem"].items()}
        key = (json.dumps(problem, sort_keys=True), json.dumps(c.detail["tiling"],
                                                               sort_keys=True))
        assert key in measured, c.name


# ncu's documented long CSV form (``ncu --csv``; see tests/test_validation_ncu.py), one row
# per (launch, metric); SYNTHETIC durations.
_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
           '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
           '"Metric Value"')


def _ncu_csv(durations_us: list[tuple[str, float]]) -> str:
    rows = [f'"{i}","4242","python3","synthetic-host","{name}","1","7","(128, 1, 1)",'
            f'"(64, 1, 1)","0","9.0","Command line profiler metrics",'
            f'"gpu__time_duration.sum","usecond","{us}"'
            for i, (name, us) in enumerate(durations_us)]
    return "\n".join(["==PROF== Connected to process 4242", _HEADER, *rows,
                      "==PROF== Disconnected from process 4242"])


def _probe_launches(first_us: float = 50.0) -> list[tuple[str, float]]:
    """The launches ``profile-target`` makes, in order: each call's kernels, the warm-up
    (``first_us`` each, to be dropped) and then NCU_REPS repeats of known durations."""
    out = []
    for call, kernels in overheads.NCU_CALLS.items():
        for rep in range(overheads.NCU_REPS + 1):
            for j, kernel in enumerate(kernels):
                base = {"empty": 2.0, "decode_k1024_n128_sp2": 10.0}.get(call, 100.0)
                out.append((kernel, first_us if rep == 0 else base + j + rep / 10))
    return out


def test_ncu_rows_drop_the_warm_up_and_take_medians():
    from validation import ncu

    launches = ncu.parse_csv(_ncu_csv(_probe_launches()))
    rows = {r["call"]: r for r in overheads.ncu_rows(launches)}
    # repeats 1..5 add 0.1..0.5 us: the median adds 0.3
    assert rows["empty"]["kernels_s"] == {"probe_empty": pytest.approx(2.3e-6)}
    dec = rows["decode_k1024_n128_sp2"]
    assert dec["kernels_s"]["decode_split"] == pytest.approx(10.3e-6)
    assert dec["kernels_s"]["decode_reduce"] == pytest.approx(11.3e-6)
    assert dec["median_s"] == pytest.approx(21.6e-6) and dec["n"] == overheads.NCU_REPS
    assert rows["decode_k16384_n32_sp4"]["median_s"] == pytest.approx(201.6e-6)
    with pytest.raises(ncu.NcuParseError, match="expected 30 launches"):
        overheads.ncu_rows(launches[:-1])
    swapped = list(launches)
    swapped[6], swapped[7] = swapped[7], swapped[6]  # decode_reduce before decode_split
    with pytest.raises(ncu.NcuParseError):
        overheads.ncu_rows(swapped)


def test_run_ncu_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """The two profiles run the probe's target under both cache controls; a stand-in ncu
    prints synthetic CSV (flushed: 50% slower) and the rows land as the two ncu modes."""
    from validation import ncu

    flushed = _ncu_csv([(k, us * 1.5) for k, us in _probe_launches()])
    warm = _ncu_csv(_probe_launches())
    (tmp_path / "all.csv").write_text(flushed)
    (tmp_path / "none.csv").write_text(warm)
    fake = tmp_path / "ncu"
    fake.write_text(f"""#!/bin/bash
case "$*" in
  *--version*) echo "NVIDIA Nsight Compute CLI"; echo "Version 2099.1.0"; exit 0;;
  *--help*) echo "--print-units --cache-control --clock-control"; exit 0;;
esac
args=("$@")
for i in "${{!args[@]}}"; do
  if [ "${{args[$i]}}" = "--cache-control" ]; then cat "{tmp_path}/${{args[$((i+1))]}}.csv"; fi
done
echo "$*" > "{tmp_path}/argv.$$"
""")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "find_ncu", lambda: str(fake))
    out = tmp_path / "o.jsonl"
    assert overheads.run_ncu(str(out), log=lambda _: None) == 0
    rows = overheads_summary.load(str(out))
    assert [(r["mode"], r["call"]) for r in rows] == [
        (mode, call) for mode in ("ncu_flushed", "ncu_warm") for call in overheads.NCU_CALLS]
    by = {(r["mode"], r["call"]): r for r in rows}
    assert by[("ncu_flushed", "empty")]["median_s"] == pytest.approx(1.5 * 2.3e-6)
    assert by[("ncu_warm", "empty")]["median_s"] == pytest.approx(2.3e-6)
    assert by[("ncu_warm", "empty")]["environment"]["ncu_version"] == "2099.1.0"
    argvs = [p.read_text() for p in tmp_path.glob("argv.*")]
    assert len(argvs) == 2
    assert all("profile-target" in a and overheads.NCU_FILTER in a
               and "gpu__time_duration.sum" in a for a in argvs)
    entries = {e["call"]: e for e in overheads_summary.summary(rows)}
    assert entries["empty"]["median_us"]["ncu_warm"] == pytest.approx(2.3)


def test_run_ncu_reports_a_profile_it_cannot_read(tmp_path, monkeypatch):
    from validation import ncu

    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/bash\necho '==ERROR== Failed to initialize the profiler'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "find_ncu", lambda: str(fake))
    out = tmp_path / "o.jsonl"
    assert overheads.run_ncu(str(out), log=lambda _: None) == 2
    rows = overheads_summary.load(str(out))
    assert [r["mode"] for r in rows] == ["ncu_flushed", "ncu_warm"]
    assert all(r["call"] == "ncu" and "no ncu result table" in r["error"]
               and "ncu said: Failed to initialize the profiler" in r["error"] for r in rows)
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    assert overheads.run_ncu(str(tmp_path / "none.jsonl"), log=lambda _: None) == 0
    assert not (tmp_path / "none.jsonl").exists()


def test_profile_target_runs_the_profiled_calls_on_the_cpu():
    pytest.importorskip("torch")
    done = _module(["profile-target", "--dry-run"], TRITON_INTERPRET="1")
    assert done.returncode == 0, done.stdout + done.stderr


def test_chase_table_is_one_cycle_through_every_node():
    torch = pytest.importorskip("torch")
    nodes = 97
    table = overhead_calls.chase_table(nodes, torch.device("cpu"))
    assert table.numel() == nodes * overhead_calls.CHASE_STRIDE
    at, seen = 0, []
    for _ in range(nodes):
        at = int(table[at])
        assert at % overhead_calls.CHASE_STRIDE == 0
        seen.append(at // overhead_calls.CHASE_STRIDE)
    assert at == 0 and sorted(seen) == list(range(nodes))  # back at the start, all visited
    off_nodes = table.view(nodes, overhead_calls.CHASE_STRIDE)[:, 1:]
    assert int(off_nodes.abs().sum()) == 0


@pytest.mark.parametrize("rows, k, warps", [(16, 16, 1), (64, 32, 4)])
def test_mma_chain_computes_the_dependent_products(rows, k, warps):
    """The matmul chain really chains: after s steps its output is A B^s with the result
    rounded to bf16 before each product, as a float64 reference does it (Triton's
    interpreter on the CPU)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = (torch.randn(k, k, generator=gen) / k ** 0.5).to(torch.bfloat16)
    out = torch.empty(rows, k, dtype=torch.bfloat16)
    steps = 3
    from kernels.common import dot_fp32

    overhead_calls._mma_chain_kernel()[(1,)](a, b, out, steps, M=rows, K=k,
                                        DOT_FP32=dot_fp32(torch.bfloat16), num_warps=warps)
    expected = a.double()
    for _ in range(steps):
        expected = (expected.to(torch.bfloat16).double() @ b.double())
    expected = expected.to(torch.bfloat16).double()
    assert torch.allclose(out.double(), expected, rtol=2e-2, atol=2e-2)
    # Not the single product: the steps compound.
    single = (a.double() @ b.double()).to(torch.bfloat16).double()
    assert not torch.allclose(out.double(), single, rtol=2e-2, atol=2e-2)


def test_precompile_covers_every_attention_call_once_per_compile():
    """``compile_configs``: one config per kernel set Triton compiles (head counts and
    query lengths other than 1 or a multiple of 16 share one), and the host code of each,
    run with its launches intercepted on empty CPU tensors as the device's compile
    workers run it, launches the kernels its calls time."""
    pytest.importorskip("triton")
    from validation.compile import capture_launches, compile_tasks

    chosen = overhead_calls.calls()
    configs = overheads.compile_configs(chosen)
    assert len(compile_tasks(configs)) == len(configs)  # the keys are unique
    attention = [c for c in chosen if "schedule" in c.detail.get("sweep", c.detail)]
    # 4 decode calls and their parts, the FA2 forward, the sweep's 25 calls; 15 compiles
    assert len(attention) == 4 + 6 + 1 + len(ctas_per_sm.specs()) and len(configs) == 15
    launched = {}
    for cfg in configs:
        problem = AttentionProblem.from_dict(dict(cfg["problem"], batch=1))
        names = {launch.name for launch in
                 capture_launches(cfg["schedule"], problem, Tiling(**cfg["tiling"]))}
        launched[(cfg["schedule"], cfg["problem"]["head_dim"], cfg["problem"]["causal"],
                  cfg["problem"]["pass_"], json.dumps(cfg["tiling"], sort_keys=True))] = names
    for c in attention:
        d = c.detail.get("sweep", c.detail)
        names = launched[(d["schedule"], d["problem"]["head_dim"], d["problem"]["causal"],
                          d["problem"]["pass_"], json.dumps(d["tiling"], sort_keys=True))]
        assert d.get("kernel", next(iter(names))) in names, c.name
