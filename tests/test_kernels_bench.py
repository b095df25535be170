"""benchmarks/kernels_gpu.py runs end to end: on the CPU in its dry-run mode, on a GPU for real.

The dry run goes through every code path of the script (autotuning, the correctness gate,
the SDPA peers, the report, the JSON file) at tiny sizes in Triton's interpreter.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "kernels_gpu.py"


def _run(args, interpret: bool, timeout: int):
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout, check=False)


def test_dry_run_on_cpu(tmp_path):
    out = tmp_path / "results.jsonl"
    proc = _run(["--dry-run", "--json", str(out)], interpret=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "naive/fa2 time" in proc.stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    impls = {(r["shape"]["pass_"], bool(r["shape"]["seq_q"]), r["impl"]) for r in results}
    peers = ("sdpa_math", "sdpa_flash")
    assert impls == {("fwd", False, i) for i in ("fa2", "naive", "fa1", *peers)} | {
        ("fwd+bwd", False, i) for i in ("fa2", "naive", *peers)} | {
        ("fwd", True, i) for i in ("decode", "fa2", *peers)}
    for r in results:
        assert r["ok"], r
        if r["impl"] != "sdpa_flash":  # the CPU may lack the FLASH backend: then noted, NaN
            assert r["median_ms"] > 0 and r["tflops"] > 0


def test_without_gpu_says_so_and_exits_cleanly():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = _run([], interpret=False, timeout=120)
    assert proc.returncode == 0
    assert "no CUDA GPU" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smallest_sweep():
    proc = _run(["--head-dim", "64", "--seq", "1024"], interpret=False, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fa2/FLASH speed" in proc.stdout
