"""The process Nsight Compute profiles: every measured config's call, once, in plan order.

Run as ``ncu ... python -m validation.profile_target PLAN IDS MANIFEST --deadline-unix T``.
It writes nothing to stdout (ncu's CSV goes there); for each call it appends one line to
MANIFEST: the config id, its role (``setup``: the forward a backward needs; ``measure``),
the kernel names the call launches and whether it succeeded — what ``ncu.match`` needs to
assign launches to configs. It stops starting calls at the deadline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from traces.problem import AttentionProblem
from traces.tiling import Tiling


def _write(manifest, entry: dict) -> None:
    manifest.write(json.dumps(entry) + "\n")
    manifest.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.profile_target")
    parser.add_argument("plan")
    parser.add_argument("ids", help="file with one config id per line, in profiling order")
    parser.add_argument("manifest")
    parser.add_argument("--deadline-unix", type=float, default=float("inf"))
    parser.add_argument("--device", default="cuda", help="cpu: a rehearsal (interpreter)")
    args = parser.parse_args(argv)

    import torch

    from kernels.common import default_tiling
    from validation import workloads
    from validation.matrix import kernel_names
    from validation.runner import shapes_in_order

    with open(args.plan) as f:
        plan = json.load(f)
    with open(args.ids) as f:
        wanted = set(f.read().split())

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    with open(args.manifest, "w") as manifest:
        for _, cfgs, _ in shapes_in_order(plan):
            cfgs = [c for c in cfgs if c["id"] in wanted]
            if not cfgs:
                continue
            if time.time() > args.deadline_unix:
                _write(manifest, {"role": "stopped", "remaining": [c["id"] for c in cfgs]})
                continue
            problem = AttentionProblem.from_dict(cfgs[0]["problem"])
            schedule = cfgs[0]["schedule"]
            try:
                inputs = workloads.make_inputs(problem, args.device)
                if problem.pass_ != "fwd":
                    setup = AttentionProblem.from_dict(dict(cfgs[0]["problem"], **{"pass": "fwd"}))
                    names = kernel_names(schedule, setup, default_tiling(schedule,
                                                                         problem.head_dim))
                    workloads.setup_backward(schedule, problem, inputs)
                    sync()
                    _write(manifest, {"config": None, "role": "setup", "kernels": names})
            except Exception as exc:
                print(f"profile_target: setup of {cfgs[0]['shape']} failed: {exc}",
                      file=sys.stderr)
                for c in cfgs:
                    _write(manifest, {"config": c["id"], "role": "measure", "kernels": [],
                                      "ok": False, "error": f"setup failed: {exc}"[:300]})
                continue
            for c in cfgs:
                if time.time() > args.deadline_unix:
                    _write(manifest, {"role": "stopped", "remaining": [c["id"]]})
                    continue
                entry = {"config": c["id"], "role": "measure", "kernels": c["kernels"],
                         "ok": True}
                try:
                    workloads.kernel_call(schedule, problem, Tiling.from_dict(c["tiling"]),
                                          inputs)()
                    sync()
                except Exception as exc:
                    entry.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
                _write(manifest, entry)
            del inputs
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
