"""What the sm_80 table of compiles (kernels/table.py) changes for an A100 user.

Run from the repository root:
    python benchmarks/sm80_table_effect.py [--jobs 2] [--match TEXT]

For a few common problems on the A100 preset, predicts the default tiling and runs
`tilesim sweep` twice, as a user without Triton does: with the table's compile facts (what
`simulate` and `sweep` take now) and with `--estimated-resources` (registers and shared
memory from the tiles, what they took before). Prints the table's pick and, for the
estimate's five best tilings, the time the table gives each. Predictions only: no record
measures an A100.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HARDWARE = ["--hardware", "a100-sxm4-80gb"]
PROBLEMS = {
    "Llama 2 7B prefill (B 1, H 32, N 4096, d 128, causal)":
        ["--batch", "1", "--heads", "32", "--seq", "4096", "--head-dim", "128", "--causal"],
    "BERT-base-like, fp16 (B 8, H 12, N 1024, d 64)":
        ["--batch", "8", "--heads", "12", "--seq", "1024", "--head-dim", "64",
         "--dtype", "fp16"],
    "Llama 2 7B training, fwd+bwd (B 4, H 32, N 2048, d 128, causal)":
        ["--batch", "4", "--heads", "32", "--seq", "2048", "--head-dim", "128", "--causal",
         "--pass", "fwd+bwd"],
    "Llama 2 7B fine-tuning on a sample as it comes, fwd+bwd (B 1, H 32, N 3000, d 128, "
    "causal)":
        ["--batch", "1", "--heads", "32", "--seq", "3000", "--head-dim", "128", "--causal",
         "--pass", "fwd+bwd"],
    "Llama 3 8B prefill, GQA (B 1, H 32, 8 K/V heads, N 8192, d 128, causal)":
        ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seq", "8192", "--head-dim",
         "128", "--causal"],
    "Llama 3 8B fine-tuning, GQA, fwd+bwd (B 2, H 32, 8 K/V heads, N 4096, d 128, causal)":
        ["--batch", "2", "--heads", "32", "--kv-heads", "8", "--seq", "4096", "--head-dim",
         "128", "--causal", "--pass", "fwd+bwd"],
    "Llama 3 8B prefill of a prompt as it comes, GQA (B 1, H 32, 8 K/V heads, N 3000, "
    "d 128, causal)":
        ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seq", "3000", "--head-dim",
         "128", "--causal"],
    "Llama 3 8B chunked prefill, GQA: a 512-token chunk after 2488 cached (B 1, H 32, "
    "8 K/V heads, N_q 512, N_kv 3000, d 128, causal)":
        ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seq", "512", "--kv-seq",
         "3000", "--head-dim", "128", "--causal"],
    "FA1's forward, Llama 2 7B prefill (B 1, H 32, N 4096, d 128, causal)":
        ["--schedule", "fa1", "--batch", "1", "--heads", "32", "--seq", "4096", "--head-dim",
         "128", "--causal"],
    "Gemma 7B prefill, d 256 (B 1, H 16, N 4096, d 256, causal)":
        ["--batch", "1", "--heads", "16", "--seq", "4096", "--head-dim", "256", "--causal"],
    "Naive attention, GPT-2 small prefill (B 1, H 12, N 1024, d 64)":
        ["--schedule", "naive", "--batch", "1", "--heads", "12", "--seq", "1024",
         "--head-dim", "64"],
}


def tilesim(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "simulator", *argv, "--json"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(done.stderr.strip())
    return json.loads(done.stdout)


def ranked(results: list[dict]) -> list[dict]:
    return [r for r in results if "error" not in r and r.get("time_s")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--match", default="",
                        help="only the problems whose name contains this text")
    args = parser.parse_args()
    jobs = ["--jobs", str(args.jobs)]
    for name, problem in PROBLEMS.items():
        if args.match not in name:
            continue
        table = tilesim("simulate", *HARDWARE, *problem)
        estimate = tilesim("simulate", *HARDWARE, *problem, "--estimated-resources")
        sources = sorted({k["resources"] for k in table["kernels"]})
        print(f"{name}: default tiling {table['time_s'] * 1e6:.1f} us from the table "
              f"({', '.join(sources)}), {estimate['time_s'] * 1e6:.1f} estimated")
        if estimate["tiling"] != table["tiling"]:  # the default fits by one rule alone
            print(f"  (the default tiling: {table['tiling']} by the table, "
                  f"{estimate['tiling']} by the estimate)")
        by_table = ranked(tilesim("sweep", *HARDWARE, *problem, *jobs)["results"])
        by_estimate = ranked(tilesim("sweep", *HARDWARE, *problem, *jobs,
                                     "--estimated-resources")["results"])
        best = by_table[0]
        times = {json.dumps(r["tiling"], sort_keys=True): r["time_s"] for r in by_table}
        print(f"  the table's pick: {best['tiling']}, {best['time_s'] * 1e6:.1f} us")
        for rank, r in enumerate(by_estimate[:5], start=1):
            t = times.get(json.dumps(r["tiling"], sort_keys=True))
            said = (f"{t * 1e6:.1f} us by the table ({(t / best['time_s'] - 1) * 100:+.0f}% "
                    f"on its pick)" if t else "not legal by the table's compiles")
            print(f"  the estimate's #{rank}: {r['tiling']}, {r['time_s'] * 1e6:.1f} us "
                  f"estimated; {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
