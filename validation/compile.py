"""Compiling the matrix's kernels before they are timed, and checking them ahead of time.

Triton compiles a kernel on its first launch: 1 to 7 s each on a CPU core (measured here:
fa2_fwd 2.9 s, fa2_bwd_dkdv 6.6 s, at sm_90), which would dominate a matrix of hundreds of
configs. Three helpers keep that cost down:

- ``capture_launches`` runs a config's host code with every ``@triton.jit`` launch
  intercepted, on empty CPU tensors of the real shapes, and returns each launch's kernel,
  arguments and options — the host code is the kernels' own, so nothing is duplicated.
- ``precompile`` (GPU machine) compiles the unique kernels of a plan in worker processes
  with ``JITFunction.warmup``, which fills Triton's on-disk cache; the timing process then
  loads them in milliseconds.
- ``aot_check`` (any machine) compiles a config's kernels for sm_90 with
  ``triton.compile(..., target=GPUTarget("cuda", 90, 32))`` and reports shared memory, so
  a plan can drop tilings that would not compile or fit on the GPU before it gets there.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from traces.problem import AttentionProblem
from traces.tiling import Tiling

SM90 = ("cuda", 90, 32)
OPTION_KEYS = ("num_warps", "num_stages")


@dataclass
class Launch:
    fn: object  # the JITFunction (or InterpretedFunction under TRITON_INTERPRET=1)
    grid: tuple
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        inner = getattr(self.fn, "fn", None)
        return getattr(inner, "__name__", None) or getattr(self.fn, "__name__", "?")


@contextlib.contextmanager
def _intercepted(launches: list[Launch]):
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    classes = [JITFunction, interpreter.InterpretedFunction]
    originals = [cls.run for cls in classes]

    def run(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self, tuple(grid) if not callable(grid) else grid, args,
                               dict(kwargs)))

    try:
        for cls in classes:
            cls.run = run
        yield
    finally:
        for cls, original in zip(classes, originals, strict=True):
            cls.run = original


def capture_launches(schedule: str, problem: AttentionProblem, tiling: Tiling) -> list[Launch]:
    """The kernel launches of a config's timed call (backward setup excluded), not run."""
    from validation import workloads

    inputs = workloads.make_inputs(problem, "cpu", empty=True)
    if problem.pass_ != "fwd":
        workloads.setup_backward(schedule, problem, inputs, empty=True)
    launches: list[Launch] = []
    with _intercepted(launches):
        workloads.kernel_call(schedule, problem, tiling, inputs)()
    return launches


def setup_launches(schedule: str, problem: AttentionProblem) -> list[Launch]:
    """The launches of a backward config's setup forward (default tiling)."""
    from validation import workloads

    inputs = workloads.make_inputs(problem, "cpu", empty=True)
    launches: list[Launch] = []
    with _intercepted(launches):
        workloads.setup_backward(schedule, problem, inputs)
    return launches


def _signature(launch: Launch) -> tuple[dict, dict, dict, dict]:
    """Signature, constexprs, options and the alignment facts the JIT would specialise on:
    tensors 16-byte aligned (torch allocations are), integers that are multiples of 16.
    Without them Triton neither vectorises nor pipelines the loads, and shared memory would
    not grow with ``num_stages`` (``kernels.resources._alignment_hints`` says the same)."""
    import torch

    types = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
    kwargs = dict(launch.kwargs)
    options = {k: kwargs.pop(k) for k in OPTION_KEYS if k in kwargs}
    bound = dict(zip(launch.fn.arg_names, launch.args, strict=False))
    bound.update(kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(launch.fn.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = types[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[param.name] = "fp32"
    return signature, constexprs, options, attrs


def aot_check(schedule: str, problem: AttentionProblem, tiling: Tiling,
              hardware: str = "h200-sxm") -> dict:
    """Compile the config's kernels for sm_90 here; ``{"ok", "kernels", "error"}``.

    Not ok if a kernel does not compile or needs more shared memory per CTA than the
    ``hardware`` preset allows (the driver would refuse the launch). Needs Triton without
    the interpreter (unset TRITON_INTERPRET). Alignment is specialised as the JIT does
    (``_signature``), so the loads are pipelined and shared memory grows with the stages.
    """
    from simulator.hardware import load_hardware

    smem_limit = load_hardware(hardware).smem_per_cta_max_bytes
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = {"ok": True, "kernels": [], "error": None}
    try:
        launches = capture_launches(schedule, problem, tiling)
    except Exception as exc:  # the host code refused the config
        return {"ok": False, "kernels": [], "error": f"{type(exc).__name__}: {exc}"}
    for launch in launches:
        signature, constexprs, options, attrs = _signature(launch)
        try:
            compiled = triton.compile(
                ASTSource(fn=launch.fn, signature=signature, constexprs=constexprs,
                          attrs=attrs),
                target=GPUTarget(*SM90), options=options)
        except Exception as exc:
            message = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            out.update(ok=False, error=f"{launch.name}: {type(exc).__name__}: {message}")
            return out
        facts = kernel_facts(launch.name, compiled)
        out["kernels"].append(facts)
        shared = facts["shared_bytes"]
        if shared > smem_limit:
            out.update(ok=False, error=f"{launch.name} needs {shared} bytes of shared memory "
                                       f"per CTA; {hardware} allows {smem_limit}")
            return out
    return out


def kernel_facts(name: str, compiled) -> dict:
    """What one compiled kernel is, from Triton's result: its shared memory per CTA, its
    registers per thread and spilled bytes (the cuobjdump in Triton's wheel reads the cubin;
    None where it cannot: the simulator's occupancy estimate is checked against these), and
    what its wgmma ask of shared memory per FLOP (``kernels.resources.wgmma_operand_demand``:
    over their mix, and the most demanding; None without wgmma), and how the compiler laid
    the warps over its matmuls (``kernels.resources.dot_layouts``: the device's Triton may
    lay them otherwise than ours; None without the TTGIR or matmuls), and its loops'
    software pipeline (``kernels.resources.loop_pipeline``: iterations of loads in flight
    at a wait, and whether the next loads are issued after the matmuls; None without a
    pipelined loop), and one iteration of its main loop in the SASS
    (``kernels.resources.main_loop``: the instructions a warp issues, the spill bytes a
    thread loads and stores, the waits for reloaded spills; None without a cubin or a loop
    with matmuls), and, for a kernel without loops, the instructions a warp issues
    (``kernels.resources.straight_instructions``), and, for a kernel with loops, those it
    issues outside them, before the first and after it
    (``kernels.resources.outside_loop_instructions``), and per iteration of its main
    loop's masked copy (``kernels.resources.masked_loop_instructions``)."""
    from kernels.resources import dot_layouts, loop_pipeline, wgmma_operand_demand

    ttgir = compiled.asm.get("ttgir", "")
    mix, worst = wgmma_operand_demand(compiled.asm.get("ptx", ""))
    registers, spill = _registers(compiled)
    in_flight, after_compute = loop_pipeline(ttgir)
    (instructions, loaded, stored, reloads, straight, prologue, epilogue,
     masked) = _sass_costs(compiled)
    return {"name": name, "shared_bytes": int(compiled.metadata.shared),
            "registers": registers, "spill_bytes": spill,
            "wgmma_smem_bytes_per_flop": mix, "wgmma_smem_bytes_per_flop_max": worst,
            "mma_layouts": dot_layouts(ttgir), "loads_in_flight": in_flight,
            "loads_issued_after_compute": after_compute,
            "loop_instructions": instructions, "spill_load_bytes_per_iteration": loaded,
            "spill_store_bytes_per_iteration": stored, "spill_reload_waits": reloads,
            "straight_instructions": straight, "prologue_instructions": prologue,
            "epilogue_instructions": epilogue, "masked_loop_instructions": masked}


def _registers(compiled) -> tuple[int | None, int | None]:
    """(registers per thread, spilled bytes) of a compiled kernel; Nones if unreadable (a
    fact that cannot be read must never cost the device run its measurements)."""
    cubin = compiled.asm.get("cubin")
    if not cubin:
        return None, None
    try:
        from kernels.resources import _cuobjdump_usage

        return _cuobjdump_usage(cubin)
    except Exception:  # noqa: BLE001 - any failure leaves the facts out, nothing else
        return None, None


def _sass_costs(compiled) -> tuple[int | None, ...]:
    """(instructions per warp, spill bytes loaded and stored per thread, waits for reloaded
    spills) of one main-loop iteration, a loop-less kernel's instructions per warp, a
    looped kernel's outside its loops, before and after them, and per iteration of its
    main loop's masked copy
    (``kernels.resources.sass_costs``); Nones if unreadable (like ``_registers``: a missing
    fact must not cost the device run anything)."""
    from kernels.resources import SASS_COSTS

    cubin = compiled.asm.get("cubin")
    if not cubin:
        return (None,) * SASS_COSTS
    try:
        from kernels.resources import sass_costs

        return sass_costs(cubin)
    except Exception:  # noqa: BLE001 - any failure leaves the facts out, nothing else
        return (None,) * SASS_COSTS


def _warm(task: tuple[str, str, dict, dict]) -> tuple[str, str, float, str | None, list]:
    """Worker: compile one config's kernels into Triton's on-disk cache (GPU machine).
    Returns the schedule, the compile key, seconds, the error if any, and the facts of the
    config's own kernels (``kernel_facts``; the backward's set-up forward excluded)."""
    schedule, key, problem_dict, tiling_dict = task
    start = time.perf_counter()
    try:
        problem = AttentionProblem.from_dict(problem_dict)
        tiling = Tiling.from_dict(tiling_dict)
        own = capture_launches(schedule, problem, tiling)
        setup = setup_launches(schedule, problem) if problem.pass_ != "fwd" else []
        compiled = [launch.fn.warmup(*launch.args, grid=launch.grid, **launch.kwargs)
                    for launch in own + setup]
    except Exception as exc:  # the timing process will compile it, or report the failure
        return schedule, key, time.perf_counter() - start, f"{type(exc).__name__}: {exc}", []
    try:  # the facts are a bonus: reading them must not fail a compile that worked
        ready = [c.result() if hasattr(c, "result") else c for c in compiled[:len(own)]]
        facts = [kernel_facts(launch.name, c) for launch, c in zip(own, ready, strict=True)]
    except Exception:
        facts = []
    return schedule, key, time.perf_counter() - start, None, facts


def launch_key(cfg: dict) -> str:
    """A config's compile key (``validation.matrix.compile_key``, frozen in its plan) and
    its kernels' job keys (``kernels.resources.job_key``: what a compile depends on,
    among it the integer arguments Triton specializes at launch on being 1 or a multiple
    of 16, which the compile key leaves out). Configs with equal launch keys run the same
    compiled kernels. Decode's split count and chunk are such integers: at N = 1k with
    32-key blocks and 32 splits its chunk is one block, a constexpr, and its split kernel
    compiles to 80 registers where the same tiling's other splits (chunks of 2 and 8
    blocks) take 72; the H200 records of 2026-11-30 carry the 72 for it, a sibling's
    facts under the shared compile key. A config without kernel names keeps its key."""
    from kernels import resources

    names = [name for name in cfg.get("kernels") or () if name in resources.KERNELS]
    if not names:
        return cfg["compile_key"]
    problem, tiling = AttentionProblem.from_dict(cfg["problem"]), Tiling.from_dict(cfg["tiling"])
    shape = resources.problem_shape(problem)
    return "|".join([cfg["compile_key"],
                     *(resources.job_key(name, SM90[1], problem.dtype, problem.head_dim, tiling,
                                         **shape) for name in names)])


def compile_tasks(configs: list[dict]) -> list[tuple[str, str, dict, dict]]:
    """One task per launch key (``launch_key``); the problem at batch 1 (batch only sizes
    the grid)."""
    tasks, seen = [], set()
    for cfg in configs:
        key = launch_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        tasks.append((cfg["schedule"], key, dict(cfg["problem"], batch=1), cfg["tiling"]))
    return tasks


def precompile(configs: list[dict], workers: int, budget_s: float, log=print) -> dict:
    """Fill Triton's cache for the configs' kernels in parallel; stops at ``budget_s``."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures import TimeoutError as FuturesTimeout

    from simulator.cli.common import cores

    tasks = compile_tasks(configs)
    start, done, failed, facts = time.monotonic(), 0, [], {}
    workers = max(1, min(workers, len(tasks), cores()))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    try:
        futures = [pool.submit(_warm, task) for task in tasks]
        for future in as_completed(futures, timeout=budget_s):
            schedule, key, seconds, error, kernels = future.result()
            done += 1
            if error:
                failed.append(f"{schedule}: {error}")
            elif kernels:
                facts[key] = kernels
    except FuturesTimeout:
        log(f"precompile: budget of {budget_s:.0f} s reached after {done}/{len(tasks)} tasks")
        # Workers still compiling would compete with the timed runs for the CPU that
        # launches kernels; the timing process compiles what is left itself.
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {"tasks": len(tasks), "done": done, "failed": failed, "workers": workers,
            "seconds": time.monotonic() - start, "kernel_facts": facts}
