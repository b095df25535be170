"""Random attention problems through `tilesim`, checked for what must hold whatever the model.

For each problem (a seeded draw of schedule, GPU preset, batch, heads, K/V heads, lengths
on and off the multiples of 16, head dim, dtype, mask and pass) it runs `tilesim count`
and `tilesim simulate` as a user would (fresh processes, the table of compiles, the
default tiling) and reports a problem where:

- one command refuses it and the other does not, or either fails otherwise than with
  exit code 2 and one line;
- `simulate`'s global bytes differ from `count`'s (both count the same tiles);
- a forward pass from a cold L2 reads less of Q, K or V from DRAM than the tensor holds
  (but FA1's Q where causal queries outnumber the keys: those no key is visible to are
  never loaded), or more than it loads, or writes O to DRAM other than once (FA2, naive,
  decode), or naive attention whose tensors fit in L2 reads more than Q, K and V there;
- with ``--engines``: the aggregated engine's time or DRAM bytes per kernel are more than
  ``simulator.sim.fluid.ERROR_BOUND`` from the full engine's, where both run in reasonable
  time (the bound the tests assert on a fixed matrix; BENCHMARKS.md, "Accuracy of the
  aggregation", lists the known cases outside it).

Run from the repository root:

    python benchmarks/random_problems.py --seed 1 --count 40 [--engines]

It found the L2 blocks of naive attention's S one column wide at 513 keys (BENCHMARKS.md,
"Simulator", 2026-12-07): at the commit before that fix, seeds 21 and 22 flag three naive
problems whose tensors fit in L2 (`--count 40` each); after it, none.

FA1 at one block of queries (N <= block_m) is left out of the engine comparison: there
the full engine issues the next pair's loads of O, l and m before the stores of the
initialisation land, and misses where the aggregated engine hits.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.sim.fluid import ERROR_BOUND  # noqa: E402
from traces.problem import DTYPE_BYTES  # noqa: E402

# Above this many tile accesses the full engine takes minutes: no engine comparison.
MAX_FULL_TILES = 400_000
# Naive attention whose tensors' bytes take less than this share of L2 must not miss on
# S and P (the rest leaves room for the whole sectors the L2 model charges short rows).
L2_ROOM = 0.8


def tilesim(*argv: str) -> tuple[int, dict | str]:
    """(exit code, the JSON output or the last line of stderr) of one `tilesim` process."""
    done = subprocess.run([sys.executable, "-m", "simulator", *argv, "--json"], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        return done.returncode, (lines[-1] if lines else "")
    return 0, json.loads(done.stdout)


def draw(rng: random.Random) -> dict:
    """One problem, as `tilesim`'s flags."""
    schedule = rng.choice(["naive", "naive", "fa1", "fa2", "fa2", "decode"])
    heads = rng.choice([1, 2, 4, 8, 12, 16])
    seq = (rng.choice([1, 2, 4, 16]) if schedule == "decode" else
           rng.choice([1, 7, 100, 256, 777, 1000, 1024, 1500, 2048, 2500, 3000]))
    return {
        "hardware": rng.choice(["h200-sxm", "h100-sxm5", "a100-sxm4-80gb", "rtx-4090"]),
        "schedule": schedule, "batch": rng.choice([1, 2, 3]), "heads": heads,
        "kv-heads": rng.choice([h for h in (1, 2, 4, 8, 12, 16) if heads % h == 0]),
        "head-dim": rng.choice([32, 64, 80, 128, 256]), "seq": seq,
        "kv-seq": rng.choice([seq, seq, 129, 513, 1200, 2049, 4096]),
        "dtype": rng.choice(["bf16", "bf16", "fp16", "fp32", "fp8"]),
        "causal": rng.random() < 0.5,
        "pass": ("fwd" if schedule in ("fa1", "decode") else
                 rng.choice(["fwd", "fwd", "bwd", "fwd+bwd"])),
    }


def flags(problem: dict) -> list[str]:
    out = []
    for name, value in problem.items():
        if name == "causal":
            out += ["--causal"] if value else []
        else:
            out += [f"--{name}", str(value)]
    return out


def forward_findings(problem: dict, pred: dict) -> list[str]:
    """What a forward pass from a cold L2 must do with Q, K, V and O."""
    e, b = DTYPE_BYTES[problem["dtype"]], problem["batch"]
    d, seq, kv = problem["head-dim"], problem["seq"], problem["kv-seq"]
    sizes = {"q": b * problem["heads"] * seq * d * e, "k": b * problem["kv-heads"] * kv * d * e,
             "v": b * problem["kv-heads"] * kv * d * e}
    # Causal with more queries than keys: the first seq - kv_seq queries see no key, and
    # FA1 never loads them.
    unseen = problem["causal"] and seq > kv and problem["schedule"] == "fa1"
    found = []
    for name, size in sizes.items():
        tensor = pred["per_tensor"].get(name)
        if tensor is None:
            continue
        if tensor["dram_read"] < size and not (name == "q" and unseen):
            found.append(f"{name}: {tensor['dram_read']} bytes read from DRAM < its {size}")
        if tensor["dram_read"] > tensor["global_read"]:
            found.append(f"{name}: {tensor['dram_read']} bytes read from DRAM > the "
                         f"{tensor['global_read']} it loads")
    o = pred["per_tensor"].get("o")
    if o and problem["schedule"] != "fa1" and o["dram_write"] != sizes["q"]:
        found.append(f"o: {o['dram_write']} bytes written to DRAM, not its {sizes['q']}")
    # Naive attention whose tensors all fit in L2 with room to spare: the softmax and P.V
    # find S and P where QK and the softmax left them.
    footprint = 2 * sizes["q"] + sizes["k"] + sizes["v"] + 2 * (sizes["q"] // d * kv)
    if (problem["schedule"] == "naive" and footprint < L2_ROOM * l2_bytes(problem["hardware"])
            and pred["bytes"]["dram_read"] != sum(sizes.values())):
        found.append(f"naive's {footprint} bytes fit in L2, yet it reads "
                     f"{pred['bytes']['dram_read']} from DRAM, not its inputs' "
                     f"{sum(sizes.values())}")
    return found


def l2_bytes(hardware: str) -> int:
    from simulator.hardware import load_hardware

    return load_hardware(hardware).l2_bytes


def engine_findings(argv: list[str], pred: dict) -> list[str]:
    """Per kernel, the aggregated engine against the full one, beyond ``ERROR_BOUND``."""
    if pred["simulation"].get("tile_accesses", 0) > MAX_FULL_TILES:
        return []
    other = "aggregated" if pred["simulation"]["mode"] == "full" else "full"
    code, second = tilesim("simulate", *argv, "--mode", other)
    if code:
        return [f"--mode {other} failed: {second}"]
    full, fast = (pred, second) if other == "aggregated" else (second, pred)
    found = []
    for a, b in zip(full["kernels"], fast["kernels"], strict=True):
        time = b["time_s"] / a["time_s"] - 1
        dram_full = a["bytes"]["dram_read"] + a["bytes"]["dram_write"]
        dram = (b["bytes"]["dram_read"] + b["bytes"]["dram_write"]) / max(dram_full, 1) - 1
        if abs(time) > ERROR_BOUND["time"] or abs(dram) > ERROR_BOUND["dram_bytes"]:
            found.append(f"{a['name']}: aggregated {time:+.1%} in time, {dram:+.1%} in DRAM "
                         f"bytes against the full engine")
    return found


def check(problem: dict, engines: bool) -> list[str]:
    argv = flags(problem)
    (code_c, counted), (code_s, pred) = tilesim("count", *argv), tilesim("simulate", *argv)
    if code_c or code_s:
        if code_c != code_s or code_c != 2:
            return [f"count exit {code_c} ({counted}), simulate exit {code_s} ({pred})"]
        return []  # refused by both, with one line
    found = []
    for name in ("global_read", "global_write"):
        if counted["bytes"][name] != pred["bytes"][name]:
            found.append(f"{name}: count {counted['bytes'][name]}, simulate "
                         f"{pred['bytes'][name]}")
    if problem["pass"] == "fwd":
        found += forward_findings(problem, pred)
    fa1_one_block = problem["schedule"] == "fa1" and problem["seq"] <= pred["tiling"]["block_m"]
    if engines and not found and not fa1_one_block:
        found += engine_findings(argv, pred)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--engines", action="store_true",
                        help="also compare the aggregated engine with the full one")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    flagged = 0
    for _ in range(args.count):
        problem = draw(rng)
        found = check(problem, args.engines)
        if found:
            flagged += 1
            print(f"tilesim simulate {' '.join(flags(problem))}")
            for line in found:
                print(f"    {line}")
    print(f"{flagged} of {args.count} problems flagged (seed {args.seed})")


if __name__ == "__main__":
    main()
