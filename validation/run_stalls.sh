#!/usr/bin/env bash
# Where the time goes inside the kernels, in ONE call of the device tool, from the repo root:
# Nsight Compute's sections (speed of light, pipe utilisation, instruction mix, occupancy,
# warp states and stall reasons, scheduler statistics) for a few configs of the default
# plan (validation/plans/stall_ids.txt: every tiling of six N = 4096 shapes; the first run
# on 2026-11-30, 60 s; stall_ids_more.txt: the plan's other N = 4096 configs, 75 s;
# stall_ids_next.txt, not yet run: FA2's spilling forward (d = 128, 128x64, 4 warps) and
# dK/dV at 128x64 with 8 warps, causal and not, beside a tiling that does not spill, and
# naive attention at N = 8k and 16k, causal and not, whose softmax at 16k causal took twice
# the non-causal's time; naive last, since replaying its N x N kernels costs most;
# stall_ids_open.txt, not yet run, first in line: the configs behind the shapes whose
# tilings the model still ranks wrong, BENCHMARKS.md "How a GPU session runs it"). The
# matrix run (run_device.sh) measures time and traffic; this run explains the compute side,
# which the model's time missed most (BENCHMARKS.md, "Validation"). Read the folders with
# python -m validation.stalls; validation/records/raw/h200-stalls-2026-11-30 holds both.
#
# The call:   run(command="bash validation/run_stalls.sh", carry=[".whl"], timeout_s=300)
# Environment: OUT (required; the tool sets it), IDS (config ids, one per line), BUDGET_S
# (seconds for profiling, default 200: profile_target starts no config after it).
# Files written to $OUT: sections.txt (the sections this ncu has), stalls.csv (ncu --csv
# --page raw: one row per kernel launch, one column per metric), stalls_manifest.jsonl
# (which config launched which kernels, as in the matrix run), stalls.log, precompile.log.
set -u -o pipefail
START=$(date +%s)
OUT=${OUT:?set OUT to the folder that receives the results}
IDS=${IDS:-validation/plans/stall_ids.txt}
BUDGET_S=${BUDGET_S:-200}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=.
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
fi

# Compile the configs' kernels in parallel first, so that ncu's run is profiling, not JIT.
cat >/tmp/precompile_ids.py <<'EOF'
import json, sys
from validation.compile import precompile
if __name__ == "__main__":  # the spawned workers import this file again
    ids = set(open(sys.argv[1]).read().split())
    plan = json.load(open("validation/plans/default.json"))
    r = precompile([c for c in plan["configs"] if c["id"] in ids], 15, 90)
    print(r["tasks"], "tasks,", r["done"], "done in", round(r["seconds"]), "s,",
          len(r["failed"]), "failed", r["failed"][:1])
EOF
PYTHONPATH=$PWD:${PYTHONPATH#.:} python3 /tmp/precompile_ids.py "$IDS" >"$OUT/precompile.log" 2>&1

# Only the sections this ncu knows (an unknown name would stop ncu before it profiles).
ncu --list-sections >"$OUT/sections.txt" 2>&1
SECTIONS=()
# MemoryWorkloadAnalysis_Tables: the L1 data pipe's wavefronts by instruction kind (shared
# loads and stores, global loads and stores) and shared memory's bank conflicts. They tell
# where the second pass goes that the model charges each byte of LDG and STG
# (simulator/sim/program.py, GLOBAL_PIPE_PASSES), and what else wgmma launches move there.
for s in SpeedOfLight ComputeWorkloadAnalysis InstructionStats Occupancy WarpStateStats \
         SchedulerStats LaunchStats MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables; do
    grep -qw "$s" "$OUT/sections.txt" && SECTIONS+=(--section "$s")
done

DEADLINE=$(( $(date +%s) + BUDGET_S ))
ncu --csv --page raw --print-units base --clock-control none --cache-control all \
    --target-processes all -k 'regex:^(fa2_|naive_|decode_)' "${SECTIONS[@]}" \
    python3 -m validation.profile_target validation/plans/default.json "$IDS" \
    "$OUT/stalls_manifest.jsonl" --deadline-unix "$DEADLINE" --device cuda \
    >"$OUT/stalls.csv" 2>"$OUT/stalls.log"
rc=$?
echo "sections: ${SECTIONS[*]}"; tail -n 1 "$OUT/precompile.log"
echo "ncu exit code $rc; $(grep -c . "$OUT/stalls.csv") CSV lines;" \
     "$(grep -c '"measure"' "$OUT/stalls_manifest.jsonl") configs measured;" \
     "$(grep -c '"ok": false' "$OUT/stalls_manifest.jsonl") failed; $(( $(date +%s) - START )) s"
tail -n 5 "$OUT/stalls.log"
exit $rc
