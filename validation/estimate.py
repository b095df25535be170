"""How long a plan takes on the GPU machine, before it gets there.

The device lease is short (one call of under 8 minutes), so a plan is sized by this
estimate and the run guards its own time as well. Costs, per phase:

- start: logging the environment (``nvidia-smi``, ``ncu --version``, the metric query)
  and starting Python with torch, triton and CUDA, once per process.
- compile: every unique (kernel, tiling, head dim, causal) once, in parallel worker
  processes. Per-kernel seconds were measured on this CPU machine compiling for sm_90
  (``validation.compile.aot_check``); the GPU machine's cores are taken to be as fast.
  Loading a cached kernel in the timing process costs ``CACHE_LOAD_S``.
- timing: per config one checked call plus ``do_bench`` (its warm-up and repeat budgets in
  ms, plus five estimate runs), per shape the inputs and the float64 reference.
- ncu: per profiled kernel launch a fixed replay overhead (``NCU_LAUNCH_S``: a few passes
  for seven metrics, each with caches flushed and written memory saved and restored — a
  lead, to be replaced by the device's measured value) plus the kernel itself per pass.
  The plan's near ties (``validation.choose.NEAR_TIE``) are profiled last, in whatever time
  is left: their ncu cost is reported apart (``optional``), not in the total that must fit
  the budget, so that they never take time from timing the others.
"""

from __future__ import annotations

from validation.choose import NEAR_TIE

ENV_LOG_S = 15.0
PROCESS_START_S = 8.0  # python + torch + triton import + CUDA context
NCU_START_S = 10.0
COMPILE_S = {"fa2_fwd": 2.9, "fa2_bwd_preprocess": 0.9, "fa2_bwd_dkdv": 6.6,
             "fa2_bwd_dq": 2.6, "decode_split": 1.5, "decode_reduce": 0.6}
COMPILE_DEFAULT_S = 1.5
# Reading each compiled kernel's facts: cuobjdump's resource usage and its SASS (the main
# loop's instructions and spills, since 2026-12-02): 0.42-0.50 s a kernel on this 2-core
# machine, measured; taken as is for the device's.
FACTS_S = 0.5
COMPILE_WORKER_START_S = 10.0
CACHE_LOAD_S = 0.1
SHAPE_SETUP_S = 0.4  # inputs, and the float64 reference of two head groups
NCU_SHAPE_SETUP_S = 0.1  # inputs only (and the forward a backward needs)
CHECK_OVERHEAD_S = 0.05
BENCH_OVERHEAD = 1.15  # do_bench's flush and event bookkeeping over its ms budgets
NCU_LAUNCH_S = 0.3  # a lead: replace with summary.json's measured value after a run
NCU_PASSES = 4
FINISH_S = 5.0


def roofline_time(pred: dict, hw) -> float:
    """A lower-bound time from exact counts: per kernel max(bytes/BW, FLOPs/peak, exps/rate)."""
    dtype = pred["problem"]["dtype"]
    total = 0.0
    for k in pred["kernels"]:
        nbytes = k["bytes"]["global_read"] + k["bytes"]["global_write"]
        total += max(nbytes / hw.hbm_effective_bytes_per_s,
                     k["flops"]["tensor"] / hw.tensor_rate(dtype),
                     k["flops"]["exp"] / hw.exp_ops_per_s)
        total += hw.kernel_launch_overhead_s
    return total


def _ncu_kernels_s(config: dict) -> float:
    """The config's kernels run under ncu: once per pass, plus bookkeeping."""
    return NCU_PASSES * config["est_time_s"] + 0.02


def _bench_s(kernel_s: float, warmup_ms: float, rep_ms: float) -> float:
    return (warmup_ms + rep_ms) / 1e3 * BENCH_OVERHEAD + 5 * kernel_s


def estimate(plan: dict, warmup_ms: float, rep_ms: float, workers: int,
             ncu: bool = True) -> dict:
    """Seconds per phase for running ``plan`` (see the module docstring for the model)."""
    from validation.compile import launch_key

    configs, peers = plan["configs"], plan["peers"]
    keys = {}
    for cfg in configs:
        keys.setdefault(launch_key(cfg), cfg["kernels"])
    compile_serial = sum(COMPILE_S.get(name, COMPILE_DEFAULT_S) + FACTS_S
                         for names in keys.values() for name in names)
    compile_s = COMPILE_WORKER_START_S + compile_serial / max(1, workers)
    shapes = {cfg["shape"] for cfg in configs}
    timing_s = (PROCESS_START_S + len(keys) * CACHE_LOAD_S + len(shapes) * SHAPE_SETUP_S
                + sum(CHECK_OVERHEAD_S + 2 * c["est_time_s"]
                      + _bench_s(c["est_time_s"], warmup_ms, rep_ms) for c in configs))
    peers_s = sum(CHECK_OVERHEAD_S + _bench_s(p["est_time_s"], warmup_ms, rep_ms)
                  for p in peers)
    required = [c for c in configs if c.get("role") != NEAR_TIE]
    near_ties = [c for c in configs if c.get("role") == NEAR_TIE]
    launches = sum(len(c["kernels"]) for c in required)
    setup_launches = len({c["shape"] for c in configs if c["problem"]["pass"] != "fwd"})
    ncu_s = near_ties_s = 0.0
    if ncu:
        ncu_s = (NCU_START_S + PROCESS_START_S + len(keys) * CACHE_LOAD_S
                 + len(shapes) * NCU_SHAPE_SETUP_S
                 + (launches + setup_launches) * NCU_LAUNCH_S
                 + sum(_ncu_kernels_s(c) for c in required))
        near_ties_s = sum(len(c["kernels"]) * NCU_LAUNCH_S + _ncu_kernels_s(c)
                          for c in near_ties)
    phases = {"start": ENV_LOG_S, "compile": compile_s, "timing": timing_s, "peers": peers_s,
              "ncu": ncu_s, "finish": FINISH_S}
    return {"phases": phases, "total_s": sum(phases.values()),
            "optional": {"ncu_near_ties": near_ties_s},
            "counts": {"configs": len(configs), "peers": len(peers), "shapes": len(shapes),
                       "compile_keys": len(keys), "profiled_launches": launches,
                       "near_ties": len(near_ties),
                       "near_tie_launches": sum(len(c["kernels"]) for c in near_ties),
                       "setup_launches": setup_launches,
                       "serial_compile_s": compile_serial,
                       "kernel_time_s": sum(c["est_time_s"] for c in configs)},
            "assumptions": {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "workers": workers,
                            "ncu_launch_s": NCU_LAUNCH_S, "ncu_passes": NCU_PASSES}}
