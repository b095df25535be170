#!/usr/bin/env bash
# The validation run on the GPU machine, in ONE call of the device tool, from the repo root.
#
# Before the call, on the session's own machine (it has pip and a network), once:
#   1. the plans in validation/plans/ are frozen with the simulator (2026-11-30); only if the
#      model changed since, re-freeze them (no GPU; over an hour on 2 cores, start it early;
#      BENCHMARKS.md has the figure); rerate if it moves only some schedules' ratings;
#      reselect if only the selection rule changed:
#        python -m validation.matrix write default quick
#        python -m validation.matrix rerate default quick --schedule decode
#        python -m validation.matrix reselect default quick
#      and check every kernel compiles and fits with the image's Triton (KINDS.md; 3.6.0 in
#      2026-11), run under that version (BENCHMARKS.md says how; passed 2026-11-30):
#        TRITON_INTERPRET=0 python -m validation.matrix compiles default quick
#   2. the image lacks simpy (the simulator's dependency); carry its wheel (pure Python):
#        python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#            --implementation cp --platform manylinux2014_x86_64 -d .whl simpy==4.1.2
#      (.whl/ is in .gitignore; the run only needs it if something on the device imports
#      the simulator — the frozen plan means the matrix itself does not.)
#   3. check the plan and its time estimate: tilesim validate --matrix default --dry-run
# Then the call:   run(command="bash validation/run_device.sh", carry=[".whl"], timeout_s=600)
# (the matrix in its 450 s, under the issue's 8 minutes, then the overheads probe in the
# rest of the 580 s budget: one start of the machine for both).
# Any Hopper the tool lends will do (a plain run asks for an H100 first, then an H200): the
# plan is the same, env.txt says which GPU ran it; commit the records as
# validation/records/<gpu>-default-<date>.jsonl (h100-... or h200-...), and reconcile picks
# the GPU's preset from the records (h100-sxm5 takes the chip's numbers from the H200
# records: the H100's are the first test of that transfer; their SM clocks, read by ncu,
# check it).
#
# Environment: OUT (required; the tool sets it), MATRIX (default|quick|mlp|plan.json, or none:
# only the extra; default "default"), BUDGET_S (seconds for everything, default 580),
# MATRIX_BUDGET_S (the matrix's share of them, counted from the start, default 450),
# DRY_RUN=1 (CPU rehearsal:
# logs what it can and runs `validate --dry-run`; no GPU needed), EXTRA (what runs after the
# matrix if EXTRA_MIN_S seconds remain: "overheads", the default, the probe of what a timed
# call costs beyond its kernels and of the kernels the model times worst with 1, 2 and 4
# CTAs per SM (validation/overheads.py, validation/ctas_per_sm.py), its attention kernels
# compiled in parallel first, then its timed calls, then its ncu part (kept 50 s); about two
# minutes; "bench", the kernels' speed beside PyTorch, benchmarks/kernels_gpu.py; "none").
#
# Files written to $OUT (the tool returns at most 8): env.txt, validate.log, records.jsonl,
# summary.json, ncu.csv, ncu.log, and two of the extra's: overheads.jsonl + overheads.log,
# or kernels_bench.jsonl + kernels_bench.log.
set -u -o pipefail
START=$(date +%s)
OUT=${OUT:?set OUT to the folder that receives the results}
MATRIX=${MATRIX:-default}
BUDGET_S=${BUDGET_S:-580}
MATRIX_BUDGET_S=${MATRIX_BUDGET_S:-450}
DRY_RUN=${DRY_RUN:-0}
EXTRA=${EXTRA:-overheads}
EXTRA_MIN_S=60  # the extra runs only if this much time is left
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
elapsed() { echo $(( $(date +%s) - START )); }

export PYTHONPATH=.
if compgen -G ".whl/*.whl" >/dev/null && [ "$DRY_RUN" != 1 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
fi

{
    echo "# date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# nvidia-smi"
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,pstate \
        --format=csv 2>&1 || true
    echo "# ncu --version"
    ncu --version 2>&1 || echo "ncu: not available"
    echo "# ncu options this script relies on"
    ncu --help 2>&1 | grep -E -- '--(print-units|clock-control|cache-control|target-processes)' \
        || echo "(none found)"
    echo "# ncu --query-metrics --chip gh100 (the metrics the run asks for)"
    ncu --query-metrics --chip gh100 2>&1 | grep -E '^(dram__bytes_(read|write)|lts__t_sectors_srcunit_tex_op_(read|write)|lts__t_sector_hit_rate|sm__sass_data_bytes_mem_shared|gpu__time_duration|gpc__cycles_elapsed) ' \
        || echo "(no metric listing)"
    # the L2 request coalescer's metrics, if the chip has one: their names, for a later
    # run to count (the non-causal tiles' L2 reads fall short of the model's; BENCHMARKS.md)
    echo "# ncu --query-metrics --chip gh100 (lrc__: the L2 request coalescer)"
    ncu --query-metrics --chip gh100 2>&1 | grep -E '^lrc__' || echo "(none listed)"
    echo "# python"
    python3 -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "gpu", torch.cuda.is_available())' 2>&1
    python3 -c 'import simpy; print("simpy", simpy.__version__)' 2>&1 || true
    echo "# setup took $(elapsed) s"
} >"$OUT/env.txt" 2>&1

# The matrix's seconds: its share of the budget (the whole budget if that is less), less
# what the set-up took and 10 s for python, torch and CUDA to start before validate, which
# measures its budget from its own start.
MATRIX_END=$(( MATRIX_BUDGET_S < BUDGET_S ? MATRIX_BUDGET_S : BUDGET_S ))
MATRIX_S=$(( MATRIX_END - $(elapsed) - 10 ))
if [ "$DRY_RUN" = 1 ]; then
    if [ "$MATRIX" = none ]; then
        echo "no matrix: the extra \"$EXTRA\" gets the $(( BUDGET_S - $(elapsed) )) s left"
        exit 0
    fi
    python3 -m validation validate --matrix "$MATRIX" --dry-run --budget-s "$MATRIX_S" \
        >"$OUT/validate.log" 2>&1
    rc=$?
    tail -n 12 "$OUT/validate.log"
    exit $rc
fi

rc=0
if [ "$MATRIX" != none ]; then
    python3 -m validation validate --matrix "$MATRIX" --out "$OUT/records.jsonl" \
        --log-dir "$OUT" --budget-s "$MATRIX_S" >"$OUT/validate.log" 2>&1
    rc=$?
fi

LEFT=$(( BUDGET_S - $(elapsed) ))
if [ "$LEFT" -lt "$EXTRA_MIN_S" ]; then
    echo "extra \"$EXTRA\" skipped: $LEFT s left, it needs $EXTRA_MIN_S"
elif [ "$EXTRA" = overheads ]; then
    # its timed calls first (their kernels compiled in parallel at the start), leaving its
    # Nsight Compute part 50 s where there are 2 minutes
    timeout "$(( LEFT - 10 - (LEFT >= 120 ? 50 : 0) ))" \
        python3 -m validation.overheads run --out "$OUT/overheads.jsonl" \
        >"$OUT/overheads.log" 2>&1 \
        || echo "overheads probe stopped or failed (see overheads.log)"
    LEFT=$(( BUDGET_S - $(elapsed) ))
    if [ "$LEFT" -ge 40 ]; then  # ncu's durations of a few of the probe's kernels
        timeout "$(( LEFT - 5 ))" python3 -m validation.overheads ncu \
            --budget-s "$(( LEFT - 15 ))" --out "$OUT/overheads.jsonl" \
            >>"$OUT/overheads.log" 2>&1 \
            || echo "overheads ncu stopped or failed (see overheads.log)"
    fi
    python3 -m validation.overheads summary "$OUT/overheads.jsonl" 2>&1
elif [ "$EXTRA" = bench ]; then
    timeout "$(( LEFT - 10 ))" python3 benchmarks/kernels_gpu.py --json "$OUT/kernels_bench.jsonl" \
        >"$OUT/kernels_bench.log" 2>&1 \
        || echo "kernels benchmark stopped or failed (see kernels_bench.log)"
fi

# The reply carries the end of the output: say what happened, last.
if [ "$MATRIX" = none ]; then
    echo "no matrix; extra \"$EXTRA\" done after $(elapsed) s"
    exit 0
fi
grep -E '^(run |timing: CUDA|ncu: killed|precompile:)' "$OUT/validate.log" | tail -n 8
python3 - "$OUT/summary.json" <<'EOF' 2>/dev/null || tail -n 20 "$OUT/validate.log"
import json, sys
s = json.load(open(sys.argv[1]))
p, e = s["phases_s"], s["estimate"]["phases"]
print("phases (actual/estimated s):", ", ".join(f"{k} {p.get(k, 0):.0f}/{e.get(k, 0):.0f}"
      for k in ("compile", "timing", "ncu")), f"total {p['total']:.0f}")
t, n = s["timing"], s["ncu"]
print(f"timed {len(t['measured'])}, failed {len(t['failed'])}, skipped {len(t['skipped'])};",
      f"counters for {n.get('configs_with_counters', 0)} configs,",
      f"{n.get('seconds_per_launch', float('nan')):.3f} s per ncu launch")
EOF
echo "validate exit code $rc after $(elapsed) s"
exit $rc
