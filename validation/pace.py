"""How fast a warp goes through its instructions, from the records: cycles per instruction.

The model times a step by what its units can do (``simulator.sim.compute``). A warp that
issues many instructions for little work, such as naive softmax's whole row in registers
at 16 or 18 instructions an element, takes longer than that: each instruction waits for
the one it needs, and a warp issues far below one a clock. The preset's
``warp_cycles_per_instruction`` is the floor the model puts under a warp's time
(``simulator.sim.program.issue_floor_s``), and this module measures it.

Per kernel of a record whose main loop's instructions are known (``kernel_facts``'
``loop_instructions``; where the record lacks them, tilesim's table of compiles gives
them, and ``--fill-loop-facts`` compiles those it lacks),
the cycles one CTA took per loop iteration: the kernel's Nsight Compute duration x the SM
clock it ran at (``sm_clock_tensor_hz`` for a kernel with matmuls) x the CTAs resident at
once (the SMs x the CTAs one SM holds, at the record's registers and shared memory; the
grid if smaller) / the loop iterations of all its CTAs; and the kernel's cycles per
instruction: the same cycles over the instructions each warp issues in all, per CTA its
iterations' (the main loop's count, the masked copy's in the iterations the schedule marks
masked) and those around its loops, where the compile counts them
(``masked_loop_instructions``, ``prologue_instructions``, ``epilogue_instructions``; the
model times each of them at this pace, ``simulator.sim.program``). Every slot counts as
busy to the end, so each pace is an upper bound of the warps' own, by the share of time
in a part-empty last wave.

The fewest cycles per instruction over all the records' loops is the preset's floor: no
loop of ours went faster. On the H200 records of 2026-11-30 it is FA2's forward at d = 128,
128 x 32, 3 stages, 4 warps (two warps per scheduler), 5.15 cycles at N = 16k with the
instructions around its loop counted, 1,449 a warp beside 512 iterations of 446 (since
2026-12-05; 5.19 without them); naive softmax, which has
no loop, agrees: at N = 4k, causal, its warps stalled 4.9 cycles per instruction on
anything but memory and barriers (``validation.stalls``), and at N = 16k, causal, 8 warps
for the row took 2.7 us less per CTA than 4 with 1,113 fewer instructions a warp: 4.8
cycles each.

    python -m validation.pace validation/records/h200-default-2026-11-30.jsonl
"""

from __future__ import annotations

import argparse
import sys

from simulator.cli.records_args import add_loop_facts_args, fill_loop_facts_as_asked
from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling


def loop_paces(records: list[dict], hw) -> list[dict]:
    """Per record and kernel with a main loop whose instructions are known and a measured
    duration: ``{"record_id", "kernel", "instructions", "resident", "iterations",
    "cycles_per_iteration", "issued", "cycles_per_instruction"}`` (module docstring;
    ``issued``: the instructions a warp issues, summed over the CTAs), fastest first."""
    import numpy as np

    from simulator.occupancy import kernel_residency
    from traces.schedules import build_schedule
    from validation.predict import compiled_resources

    paces = []
    for rec in records:
        counted = (rec.get("counters") or {}).get("kernels") or ()
        durations = {}
        for entry in counted:  # a kernel launched twice: its first launch
            if entry.get("duration_s"):
                durations.setdefault(entry["name"], float(entry["duration_s"]))
        compiled = compiled_resources(rec, hw) or {}
        if rec.get("implementation") != "triton" or not durations or not compiled:
            continue
        problem = AttentionProblem.from_dict(rec["problem"])
        tiling = Tiling.from_dict(rec["tiling"])
        for kernel in build_schedule(problem, tiling, rec["schedule"]).kernels:
            given = compiled.get(kernel.name)
            iterations = int(kernel.loop_count.sum())
            if (given is None or not given.loop_instructions or not iterations
                    or kernel.name not in durations):
                continue
            res = kernel_residency(kernel, tiling, problem.head_dim, hw, compiled)
            clock = (hw.at_tensor_clock() if kernel.dots else hw).sm_clock_hz
            resident = min(hw.sm_count * res.ctas_per_sm, kernel.grid)
            cycles = durations[kernel.name] * clock * resident
            issued = iterations * given.loop_instructions
            if given.masked_loop_instructions:
                masked = int(np.count_nonzero(kernel.masked_iterations()))
                issued += masked * (given.masked_loop_instructions - given.loop_instructions)
            issued += kernel.grid * ((given.prologue_instructions or 0)
                                     + (given.epilogue_instructions or 0))
            paces.append({"record_id": rec["record_id"], "kernel": kernel.name,
                          "instructions": given.loop_instructions, "resident": resident,
                          "iterations": iterations, "cycles_per_iteration": cycles / iterations,
                          "issued": issued, "cycles_per_instruction": cycles / issued})
    return sorted(paces, key=lambda p: p["cycles_per_instruction"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.pace",
                                     description="Cycles per instruction a warp took through "
                                                 "each main loop of the records, fastest "
                                                 "first: the preset's "
                                                 "warp_cycles_per_instruction is the first.")
    parser.add_argument("records", nargs="+")
    parser.add_argument("--hardware", default="h200-sxm")
    add_loop_facts_args(parser)  # by default, the loop facts of tilesim's table of compiles
    parser.add_argument("--top", type=int, default=10, help="loops listed (default 10)")
    args = parser.parse_args(argv)
    try:
        from simulator.hardware import load_hardware
        from validation.records import read_records

        hw = load_hardware(args.hardware)
        records = [rec for path in args.records for rec in read_records(path)[0]]
        records, _ = fill_loop_facts_as_asked(records, args, "pace")
        paces = loop_paces(records, hw)
    except ProblemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not paces:
        print("error: no record has a kernel with a measured duration and its main loop's "
              "instructions (try --fill-loop-facts, which compiles what tilesim's table of "
              "compiles lacks)", file=sys.stderr)
        return 2
    print(f"{'cycles/instr':>12} {'cycles/iter':>11} {'instr':>5} {'resident':>8}  kernel, record")
    for p in paces[:args.top]:
        print(f"{p['cycles_per_instruction']:12.2f} {p['cycles_per_iteration']:11.0f} "
              f"{p['instructions']:5d} {p['resident']:8d}  {p['kernel']}, {p['record_id']}")
    print(f"{len(paces)} loops; the fewest cycles per instruction: "
          f"{paces[0]['cycles_per_instruction']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
