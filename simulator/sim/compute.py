"""How long a compute step takes on one SM: the busiest of its three units.

A step's work is counted by the schedules as tensor-core FLOPs, exps (special-function unit)
and other FLOPs (FMA-free elementwise work on the FP32 ALUs). Each unit runs at its chip rate
divided evenly over the SMs:

- tensor cores: ``tensor_flops_per_s[dtype] x tensor_efficiency`` (fp32 inputs mean TF32);
- special-function unit: ``exp_ops_per_s`` (FA3 §3.1 counts 16 ops/SM/clock);
- FP32 ALUs: ``fp32_flops_per_s / 2`` operations per second, because the datasheet counts
  an FMA as two FLOPs and every "other" FLOP is one instruction at FMA throughput.

Overlap model: within a step the three units work concurrently (warps of a CTA, and warp
groups in ping-pong, keep them all busy), so a step takes the time of its busiest unit,
``max(tensor, exp, fp32)``. Steps of one CTA run one after another; CTAs resident on the same
SM share its units first come, first served.
"""

from __future__ import annotations

import numpy as np

from simulator.hardware import Hardware

UNITS = ("tensor", "exp", "fp32")


def sm_rates(hw: Hardware, dtype: str) -> np.ndarray:
    """Operations per second of one SM's tensor cores, exp unit and FP32 ALUs."""
    return np.array([
        hw.tensor_rate(dtype) / hw.sm_count,
        hw.exp_ops_per_s / hw.sm_count,
        hw.fp32_flops_per_s / 2 / hw.sm_count,
    ])


def unit_seconds(amounts: np.ndarray, hw: Hardware, dtype: str) -> np.ndarray:
    """Seconds each unit of one SM needs: ``amounts`` is ``[3, n]`` (tensor, exp, other)."""
    return np.asarray(amounts, dtype=np.float64) / sm_rates(hw, dtype)[:, None]
