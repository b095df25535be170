"""Correctness of a measured call: FlashAttention's rule against a float64 reference.

The rule (flash-attention's tests): ``max|out - ref| <= 2 * max|out_pt - ref|``, where
``ref`` is float64 and ``out_pt`` is PyTorch's plain implementation in the same low
precision. A float64 reference of the whole problem at N = 16k would not fit, so the check
covers two K/V-head groups — the first (batch 0, kv head 0) and the last — each with every
query head that reads it (GQA), over the full sequences. Heads are independent, so this is
exact for those heads; the rest of the output is checked to be finite (the kernels allocate
NaN-poisoned outputs during the check, so an unwritten element shows).

References are computed once per problem and reused for every tiling (``ReferenceCache``).
"""

from __future__ import annotations

import torch

from traces.problem import AttentionProblem

RULE = "max|out-ref| <= 2*max|out_pt-ref| (ref float64, out_pt PyTorch in the same dtype)"
RULE_FACTOR = 2.0


def checked_groups(problem: AttentionProblem) -> list[tuple[int, int]]:
    """(batch, kv head) pairs the check covers: the first and the last."""
    first, last = (0, 0), (problem.batch - 1, problem.kv_heads - 1)
    return [first] if first == last else [first, last]


def _slices(problem: AttentionProblem, b: int, kvh: int):
    g = problem.group_size
    return (slice(b, b + 1), slice(kvh * g, (kvh + 1) * g)), (slice(b, b + 1),
                                                              slice(kvh, kvh + 1))


class ReferenceCache:
    """float64 and low-precision PyTorch outputs of one problem's checked head groups."""

    def __init__(self, problem: AttentionProblem, inputs) -> None:
        self.problem, self.inputs = problem, inputs
        self._refs: dict[tuple[int, int], tuple[dict, dict]] = {}

    def get(self, b: int, kvh: int) -> tuple[dict, dict]:
        """(float64 outputs, low-precision PyTorch outputs) of group (b, kvh), by name."""
        if (b, kvh) not in self._refs:
            self._refs[(b, kvh)] = (self._compute(b, kvh, torch.float64),
                                    self._compute(b, kvh, None))
        return self._refs[(b, kvh)]

    def _compute(self, b: int, kvh: int, dtype) -> dict:
        from kernels.reference import pytorch_attention

        p, x = self.problem, self.inputs
        qs, ks = _slices(p, b, kvh)
        leaves = [t[s].detach().clone() for t, s in ((x.q, qs), (x.k, ks), (x.v, ks))]
        if dtype is not None:
            leaves = [t.to(dtype) for t in leaves]
        if p.pass_ == "fwd":
            with torch.no_grad():
                return {"o": pytorch_attention(*leaves, causal=p.causal, sm_scale=x.sm_scale)}
        for t in leaves:
            t.requires_grad_()
        out = pytorch_attention(*leaves, causal=p.causal, sm_scale=x.sm_scale)
        do = x.do[qs].to(out.dtype)
        dq, dk, dv = torch.autograd.grad(out, leaves, do)
        return {"dq": dq, "dk": dk, "dv": dv}


def check(problem: AttentionProblem, outputs: dict, refs: ReferenceCache) -> dict:
    """Apply the rule to every output of the call; returns the ``correctness`` record part."""
    result = {"ok": True, "rule": RULE, "groups_checked": checked_groups(problem),
              "outputs": {}, "reason": None}
    for name, out in outputs.items():
        if not bool(torch.isfinite(out).all()):
            result["ok"] = False
            result["reason"] = f"{name} has non-finite elements (unwritten or overflow)"
            result["outputs"][name] = {"max_abs_error": None, "pytorch_max_abs_error": None}
            continue
        err = pt_err = 0.0
        for b, kvh in result["groups_checked"]:
            ref, pt = refs.get(b, kvh)
            qs, ks = _slices(problem, b, kvh)
            piece = out[ks if name in ("dk", "dv") else qs]
            truth = ref[name].to(piece.device)
            err = max(err, float((piece.double() - truth).abs().max()))
            pt_err = max(pt_err, float((pt[name].double().to(piece.device) - truth).abs().max()))
        result["outputs"][name] = {"max_abs_error": err, "pytorch_max_abs_error": pt_err}
        if err > RULE_FACTOR * pt_err and result["ok"]:
            result["ok"] = False
            result["reason"] = (f"{name}: max error {err:.3g} exceeds {RULE_FACTOR:g}x "
                                f"PyTorch's {pt_err:.3g}")
    errs = [o["max_abs_error"] for o in result["outputs"].values()]
    result["max_abs_error"] = None if None in errs else max(errs, default=None)
    result["groups_checked"] = [list(g) for g in result["groups_checked"]]
    return result
