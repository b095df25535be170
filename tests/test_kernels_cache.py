"""Compile results are cached: a job found in the cache file is not compiled again.

The worker (``kernels.resources._run_worker``) is replaced by a fake that answers with
made-up numbers and counts what it is asked, so these tests compile nothing.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

from kernels import resources  # noqa: E402
from traces.tiling import Tiling  # noqa: E402

TILINGS = [Tiling(64, 32, 2, 4), Tiling(64, 64, 2, 4)]


@pytest.fixture
def fake_worker(monkeypatch, tmp_path):
    """A worker that reports 100 + block_n registers; the jobs it was given, by call."""
    monkeypatch.setenv(resources.CACHE_ENV, str(tmp_path))
    calls: list[list[str]] = []

    def run(jobs, on_result):
        calls.append([job["key"] for job in jobs])
        for job in jobs:
            t = Tiling.from_dict(job["tiling"])
            row = resources.KernelResources(
                kernel=job["kernel"], arch=job["arch"], dtype=job["dtype"],
                head_dim=job["head_dim"], block_m=t.block_m, block_n=t.block_n,
                num_stages=t.num_stages, num_warps=t.num_warps, shared_bytes=1024 * t.block_n,
                registers=100 + t.block_n, spill_bytes=0)
            on_result(row.to_dict() | {"key": job["key"]})

    monkeypatch.setattr(resources, "_run_worker", run)
    return calls


def _measure(dtype="bf16"):
    return resources.measure(["fa2_fwd"], archs=(90,), dtype=dtype, head_dim=64,
                             tilings=TILINGS, workers=1)


def test_a_second_run_compiles_nothing_and_reports_the_same(fake_worker):
    first = _measure()
    assert len(fake_worker) == 1 and len(fake_worker[0]) == 2
    second = _measure()
    assert len(fake_worker) == 1  # no worker started
    assert second == first
    assert [r.registers for r in second] == [132, 164]


def test_the_cache_key_holds_the_dtype(fake_worker):
    _measure("bf16")
    _measure("fp16")
    assert len(fake_worker) == 2  # fp16 is another compile


def test_only_the_missing_jobs_are_compiled(fake_worker):
    resources.measure(["fa2_fwd"], archs=(90,), dtype="bf16", head_dim=64,
                      tilings=TILINGS[:1], workers=1)
    _measure()
    assert [len(keys) for keys in fake_worker] == [1, 1]


def test_a_damaged_cache_line_is_compiled_again(fake_worker):
    _measure()
    path = resources.cache_path()
    lines = path.read_text().splitlines()
    entry = json.loads(lines[0])
    del entry["result"]["registers"]  # a foreign or older format
    path.write_text(json.dumps(entry) + "\n" + lines[1][: len(lines[1]) // 2] + "\n")
    again = _measure()
    assert [len(keys) for keys in fake_worker] == [2, 2]
    assert [r.registers for r in again] == [132, 164]


def test_a_cache_line_of_the_wrong_types_is_compiled_again(fake_worker):
    _measure()
    path = resources.cache_path()
    lines = path.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["result"]["registers"] = "132"  # a string where the compiler counts
    path.write_text(json.dumps(entry) + "\n" + lines[1] + "\n")
    again = _measure()
    assert [len(keys) for keys in fake_worker] == [2, 1]
    assert [r.registers for r in again] == [132, 164]


def test_the_cache_file_names_triton_and_the_kernel_sources(fake_worker, monkeypatch):
    import pathlib

    import triton

    path = resources.cache_path()
    assert f"triton{triton.__version__}-" in path.name
    monkeypatch.setattr(triton, "__version__", "0.0-other")
    other_triton = resources.cache_path()
    assert other_triton != path  # another Triton: another file
    read = pathlib.Path.read_bytes

    def edited(self):  # fa2.py as if a kernel had been edited
        return read(self) + (b"# edited" if self.name == "fa2.py" else b"")

    monkeypatch.setattr(pathlib.Path, "read_bytes", edited)
    assert resources.cache_path() not in (path, other_triton)  # another source: another file


def test_failed_or_partial_results_are_not_cached(fake_worker, monkeypatch):
    """An error or a missing register count may be the machine's (ptxas killed, no
    cuobjdump), not the kernel's: asked again, such a job is compiled again."""
    run = resources._run_worker

    def flaky(jobs, on_result):
        def answer(result):
            if result["block_n"] == 32:
                result = result | {"registers": None}
            if result["block_n"] == 64:
                result = result | {"error": "ptxas killed"}
            on_result(result)
        run(jobs, answer)

    monkeypatch.setattr(resources, "_run_worker", flaky)
    _measure()
    _measure()
    assert [len(keys) for keys in fake_worker] == [2, 2]


def test_a_job_shared_by_head_dims_is_labelled_with_the_one_asked_for(fake_worker):
    """naive_softmax has no HEAD_DIM constexpr: one compile serves every head_dim."""
    def softmax(d):
        (r,) = resources.measure(["naive_softmax"], archs=(90,), dtype="bf16", head_dim=d,
                                 tilings=TILINGS[:1], workers=1)
        return r

    assert softmax(64).head_dim == 64
    assert softmax(128).head_dim == 128
    assert len(fake_worker) == 1


def test_an_empty_cache_dir_turns_the_cache_off(fake_worker, monkeypatch, tmp_path):
    monkeypatch.setenv(resources.CACHE_ENV, "")
    assert resources.cache_path() is None
    _measure()
    _measure()
    assert len(fake_worker) == 2
    assert not list(tmp_path.iterdir())


def test_an_unwritable_cache_is_only_slower(fake_worker, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(resources.CACHE_ENV, str(blocker / "cache"))
    assert [r.registers for r in _measure()] == [132, 164]
    assert [r.registers for r in _measure()] == [132, 164]
    assert len(fake_worker) == 2


def test_what_a_compile_prints_does_not_reach_the_workers_results(tmp_path):
    """The worker's stdout carries one JSON result per job and nothing else: Triton prints
    the PTX of a kernel ptxas rejects to stdout (FA2's dQ at head_dim 256, 128 x 256, 8
    warps, 1 stage), and ptxas, a child process, writes to the same file. Here the compile
    is a stand-in that does both, in a real worker process."""
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "from kernels import resources\n"
        "def noisy(kernel, arch, dtype, head_dim, tiling, **shape):\n"
        "    print('\\n======== Internal Triton PTX codegen error ========\\n')\n"
        "    subprocess.run(['echo', 'ptxas fatal'])\n"
        "    return resources.KernelResources(kernel=kernel, arch=arch, dtype=dtype,\n"
        "        head_dim=head_dim, block_m=tiling.block_m, block_n=tiling.block_n,\n"
        "        num_stages=tiling.num_stages, num_warps=tiling.num_warps,\n"
        "        shared_bytes=None, registers=None, spill_bytes=None, error='ptxas')\n"
        "resources.compile_one = noisy\n"
        "resources._serve()\n")
    jobs = [{"key": f"job{i}", "kernel": "fa2_bwd_dq", "arch": 90, "dtype": "bf16",
             "head_dim": 256, "tiling": tiling.to_dict(), "shape": {"causal": True}}
            for i, tiling in enumerate(TILINGS)]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          input="".join(json.dumps(job) + "\n" for job in jobs),
                          cwd=resources.Path(resources.__file__).resolve().parents[1],
                          timeout=120)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["key"] for r in results] == ["job0", "job1"]
    assert [r["error"] for r in results] == ["ptxas", "ptxas"]
    assert "PTX codegen error" in done.stderr and "ptxas fatal" in done.stderr
