"""The validation matrices: which problems and tilings are measured, in which order.

A matrix is a list of groups (schedule, pass, head dim, causal) and sequence lengths. Per
group, the tilings are chosen from a candidate pool by asking the model: every candidate is
predicted at every sequence length of the group, and four are kept that the model rates
differently at every length — the predicted best (by geometric mean over the lengths), its
runner-up, and two that spread the ratings — plus a near tie of the best when the
runner-up is far from it (``choose``). One set per group, not per
shape: Triton compiles a kernel per (tiling, head dim, causal), not per sequence length,
so sharing the set keeps compile time — the largest cost of a device run — small.
Without the timing simulator the ratings are the exact global-memory bytes (count-based
distinctness), and the plan says so.

The result is a plan (``tilesim.plan/1``): configs in measurement order (shapes interleaved
across groups, so a run cut short by its time budget still covers every group), the
PyTorch peers of every problem, and every legal candidate's ratings per group
(``candidate_ratings``), so that a new selection rule can be applied without rating the
candidates again. Plans are frozen into
``validation/plans/<name>.json`` by ``python -m validation.matrix write default quick``, so
that the GPU machine needs no model. When the model changes, ``rerate --schedule S`` rates
one schedule's groups again and keeps the others' ratings (each group records when it was
rated, ``rated_utc``); ``reselect`` applies a new selection rule to the kept ratings.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from traces.problem import AttentionProblem, ProblemError
from traces.schedules import SCHEDULE_NAMES
from traces.tiling import Tiling
from validation.predict import Predictor, map_tasks

PLAN_SCHEMA = "tilesim.plan/1"
PLAN_DIR = Path(__file__).parent / "plans"
TILINGS_PER_SHAPE = 4
MIN_GAP = 0.02  # two ratings closer than 2% do not count as "rated differently"
# A runner-up rated more than this much slower than the best (geometric mean over the
# lengths) cannot test the regret target (5%; twice that is no close call): the best-rated
# candidate it passed over, a near tie, is measured too.
CLOSE_CALL = 0.10
NEAR_TIE = "near tie"  # the role of that candidate in the plan (profiled last)
# Naive attention keeps S and P ([B, H, N, N]) in HBM, and the MATH peer two more such
# tensors; a shape runs only while those four fit in this fraction of the GPU's memory.
NAIVE_MEMORY_FRACTION = 0.5
NAIVE_NXN_TENSORS = 4

# Candidate tilings (block_m, block_n, num_stages, num_warps), per schedule and pass: the
# ranges the Triton tutorial and FlashAttention use; the model picks among them.
CANDIDATES = {
    ("fa2", "fwd"): [(128, 64, 3, 8), (128, 128, 2, 8), (128, 32, 3, 4), (128, 64, 2, 4),
                     (64, 64, 3, 4), (64, 128, 2, 4), (64, 32, 2, 4), (32, 64, 2, 4),
                     (32, 32, 2, 4), (16, 64, 2, 4)],
    ("fa2", "bwd"): [(64, 64, 2, 4), (32, 64, 2, 4), (64, 32, 2, 4), (32, 32, 2, 4),
                     (128, 64, 2, 8), (64, 128, 2, 8), (32, 128, 2, 4), (128, 32, 2, 4),
                     (16, 64, 2, 4)],
    ("naive", "fwd"): [(64, 64, 2, 4), (128, 64, 2, 8), (64, 128, 2, 8), (128, 128, 2, 8),
                       (32, 64, 2, 4), (64, 32, 2, 4), (32, 32, 2, 4), (16, 32, 2, 4)],
}
# Decode: block_n and split_kv matter (block_m is unused); (block_n, split_kv, stages, warps).
DECODE_CANDIDATES = [(32, 4, 2, 4), (32, 16, 2, 4), (32, 32, 2, 4), (64, 4, 2, 4),
                     (64, 8, 2, 4), (64, 16, 2, 4), (128, 2, 2, 4), (128, 4, 2, 4),
                     (128, 8, 2, 4)]
# The "mlp" probe: decode's split kernel with the same 8 KB (d = 64) or 16 KB (d = 128) tiles
# and 2, 3 and 4 stages, so 1, 2 and 3 tiles ahead per CTA, and with larger tiles at 2
# stages. Does HBM's rate follow the bytes in flight (BENCHMARKS.md, "What is left")? Every
# tiling is measured: a probe chooses nothing.
PROBE_DECODE = ((32, 4, 2, 4), (32, 4, 3, 4), (32, 4, 4, 4), (64, 4, 2, 4), (128, 4, 2, 4))
# And FA2's kernels with the same tiles at 2 and 3 stages: Triton issues an iteration's
# next loads after its matmuls (``kernels.resources.loop_pipeline``), so at 2 stages a CTA
# cannot overlap them with its own compute, and at 3 it can. How much slower are 2 stages
# where one CTA holds an SM (BENCHMARKS.md, "Loads in the compile's order")? As
# CANDIDATES writes them: (block_m, block_n, stages, warps).
PROBE_FA2 = {"fwd": ((128, 128, 2, 8), (128, 128, 3, 8), (128, 64, 2, 4), (128, 64, 3, 4)),
             "bwd": ((128, 64, 2, 8), (128, 64, 3, 8), (64, 64, 2, 4), (64, 64, 3, 4))}
PROBE = "probe"  # the role of a probe's configs in the plan


@dataclass(frozen=True)
class Group:
    """Shapes that share one set of tilings: everything fixed but the sequence length."""

    schedule: str
    pass_: str
    head_dim: int
    causal: bool
    seqs: tuple[int, ...]
    # A probe's tilings, every one measured, as the schedule's candidates write them:
    # decode's (block_n, split_kv, stages, warps), the others' (block_m, block_n, stages,
    # warps). Empty: the schedule's candidates, of which the model chooses.
    probe: tuple[tuple[int, int, int, int], ...] = ()

    def problem(self, n: int) -> AttentionProblem:
        if self.schedule == "decode":  # one query per head, GQA group of 4, K/V of length n
            return AttentionProblem(batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=n,
                                    head_dim=self.head_dim, dtype="bf16", causal=self.causal)
        # 16k tokens per batch: every shape moves several times the L2 and fills the SMs.
        return AttentionProblem(batch=max(1, 16384 // n), heads=16, seq_q=n,
                                head_dim=self.head_dim, dtype="bf16", causal=self.causal,
                                pass_=self.pass_)

    def candidates(self) -> list[Tiling]:
        if self.schedule == "decode":
            return [Tiling(block_m=16, block_n=bn, split_kv=s, num_stages=st, num_warps=w)
                    for bn, s, st, w in self.probe or DECODE_CANDIDATES]
        return [Tiling(block_m=bm, block_n=bn, num_stages=st, num_warps=w)
                for bm, bn, st, w in self.probe or CANDIDATES[(self.schedule, self.pass_)]]

    @property
    def label(self) -> str:
        return (f"{self.schedule} {self.pass_} d={self.head_dim}"
                f"{' causal' if self.causal else ''}")


SEQS = (1024, 2048, 4096, 8192, 16384)
# Measurement order of the sequence lengths: a run cut short still spans small and large.
SEQ_PRIORITY = (4096, 1024, 16384, 2048, 8192)


def groups_for(name: str) -> list[Group]:
    """The groups of a named matrix (``default``, ``quick`` or the ``mlp`` probe)."""
    if name == "default":
        out = []
        for schedule, pass_ in (("fa2", "fwd"), ("fa2", "bwd"), ("naive", "fwd")):
            for d, causal in itertools.product((64, 128), (False, True)):
                out.append(Group(schedule, pass_, d, causal, SEQS))
        # decode has one query row: a causal mask (bottom-right) hides nothing, so "causal"
        # would measure the same kernel twice.
        out += [Group("decode", "fwd", d, False, SEQS) for d in (64, 128)]
        return out
    if name == "quick":
        return [Group("fa2", "fwd", 128, False, (2048, 8192)),
                Group("fa2", "fwd", 128, True, (8192,)),
                Group("fa2", "bwd", 128, True, (4096,)),
                Group("naive", "fwd", 128, False, (2048,)),
                Group("decode", "fwd", 128, False, (16384,))]
    if name == "mlp":
        return ([Group("decode", "fwd", d, False, (16384,), probe=PROBE_DECODE)
                 for d in (64, 128)]
                + [Group("fa2", pass_, 64, False, (4096,), probe=PROBE_FA2[pass_])
                   for pass_ in ("fwd", "bwd")])
    raise ProblemError(f'unknown matrix "{name}"; known: default, quick, mlp (or a plan .json '
                       'path)')


def kernel_names(schedule: str, problem: AttentionProblem, tiling: Tiling) -> list[str]:
    """The kernels a config's call launches, in launch order (from the schedule)."""
    from traces.schedules import build_schedule

    return [k.name for k in build_schedule(problem, tiling, schedule).kernels]


def naive_fits(problem: AttentionProblem, hbm_bytes: int) -> bool:
    nxn = problem.batch * problem.heads * problem.seq_q * problem.seq_kv * problem.elem_bytes
    return NAIVE_NXN_TENSORS * nxn <= NAIVE_MEMORY_FRACTION * hbm_bytes


def rating(pred: dict, by: str) -> float | None:
    """The number tilings are told apart by: predicted time, or exact global bytes."""
    if not pred.get("legal", True):
        return None
    if by == "simulator":
        return pred.get("time_s")
    return float(pred["bytes"]["global_read"] + pred["bytes"]["global_write"])


def _min_gap(combo: tuple[int, ...], table: list[list[float]]) -> float:
    """Smallest relative difference between two chosen tilings over all lengths."""
    gap = math.inf
    for row in table:
        values = sorted(row[i] for i in combo)
        for a, b in itertools.pairwise(values):
            gap = min(gap, (b - a) / a)
    return gap


def choose(table: list[list[float]], k: int = TILINGS_PER_SHAPE) -> tuple[list[int], float]:
    """Indices of the candidates (columns of ``table``, rows = lengths) to measure: ``k``
    rated differently, and one near tie when the runner-up is far.

    Always the candidate with the best geometric-mean rating and its runner-up: the next
    best that is rated at least ``MIN_GAP`` apart from it at every length (the second best
    overall if none is). Measuring the close call is what makes the regret of the
    predicted-best tiling a test of the model: against tilings rated far worse, it only
    tests gross errors. The ``k - 2`` others spread the ratings: they maximise the
    smallest relative gap between any two chosen ratings at any length, then the smallest
    gap among them and the best alone (so they also span the range when the close call
    sets the first gap). When that runner-up is rated more than ``CLOSE_CALL`` slower, the
    candidates it passed over are near ties of the best (the model says they do not
    matter, e.g. block_n at block_m = 128): the best-rated of them is added, last, so that
    the measurement can say whether they do. Returns the indices (best, runner-up, the
    others from fastest rated, the near tie if any) and the smallest gap of the first ``k``.
    """
    n = len(table[0]) if table else 0
    if n < k:
        raise ValueError(f"need at least {k} legal candidates, got {n}")
    geo = [sum(math.log(row[i]) for row in table) for i in range(n)]
    ranked = sorted(range(n), key=lambda i: (geo[i], i))
    best = ranked[0]
    apart = [i for i in ranked[1:] if _min_gap((best, i), table) >= MIN_GAP]
    runner_up = (apart or ranked[1:])[0]
    others = [i for i in range(n) if i not in (best, runner_up)]
    combo = max(itertools.combinations(others, k - 2),
                key=lambda c: (_min_gap((best, runner_up, *c), table),
                               _min_gap((best, *c), table), -sum(c)))
    chosen = [best, runner_up, *sorted(combo, key=lambda i: geo[i])]
    gap = _min_gap(tuple(chosen), table)
    near_ties = [i for i in ranked[1:ranked.index(runner_up)] if i not in chosen]
    if near_ties and (geo[runner_up] - geo[best]) / len(table) > math.log1p(CLOSE_CALL):
        chosen.append(near_ties[0])
    return chosen, gap


def role_of(position: int) -> str:
    """Why the tiling at ``position`` of ``choose``'s result is measured."""
    if position >= TILINGS_PER_SHAPE:
        return NEAR_TIE
    return ("best", "runner-up")[position] if position < 2 else "spread"


def config_id(schedule: str, p: AttentionProblem, t: Tiling | None, impl: str = "triton") -> str:
    head = schedule if impl == "triton" else impl
    kv = f"-kv{p.kv_heads}" if p.kv_heads != p.heads else ""
    base = (f"{head}-{p.pass_}-b{p.batch}-h{p.heads}{kv}-q{p.seq_q}-k{p.seq_kv}-d{p.head_dim}"
            f"-{p.dtype}{'-causal' if p.causal else ''}")
    if t is None:
        return base
    split = f"-sp{t.split_kv}" if t.split_kv > 1 else ""
    return f"{base}-m{t.block_m}-n{t.block_n}-s{t.num_stages}-w{t.num_warps}{split}"


def compile_key(schedule: str, p: AttentionProblem, t: Tiling) -> str:
    """Configs with equal keys share compiled kernels (the sequence length is a runtime
    argument, except for naive softmax whose row length is a compile-time constant, and
    decode's split count is a runtime argument)."""
    seq = f"-k{p.seq_kv}" if schedule == "naive" else ""
    block_m = "" if schedule == "decode" else f"m{t.block_m}"
    return (f"{schedule}-{p.pass_}-d{p.head_dim}-{p.dtype}-c{int(p.causal)}-g{p.group_size}"
            f"-{block_m}n{t.block_n}-s{t.num_stages}-w{t.num_warps}{seq}")


@dataclass
class RatedGroup:
    """A group's legal candidates and their ratings and expected times (``[length][i]``),
    and when the model rated them (UTC)."""

    group: Group
    seqs: list[int]
    legal: list[Tiling]
    columns: list[list[float]]
    times: list[list[float]]
    rated_utc: str


def _transpose(table: list[list[float]]) -> list[list[float]]:
    """Per candidate <-> per length (plans keep ratings per candidate; ``choose`` takes them
    per length)."""
    return [list(row) for row in zip(*table, strict=True)]


def _lengths(groups: list[Group], hw) -> tuple[dict, list[str]]:
    """Each group's sequence lengths that run on ``hw``, and notes on those left out."""
    seqs_of, notes = {}, []
    for group in groups:
        seqs_of[group] = [n for n in group.seqs if group.schedule != "naive"
                          or naive_fits(group.problem(n), hw.hbm_bytes)]
        if len(seqs_of[group]) < len(group.seqs):
            notes.append(f"{group.label}: N={sorted(set(group.seqs) - set(seqs_of[group]))} "
                         "left out, N x N does not fit")
    return seqs_of, notes


def build_plan(name: str, hw, predictor: Predictor, model: str,
               aot=None, log=lambda *_: None, jobs: int = 1) -> dict:
    """Choose the tilings of every group and lay out the measurement order.

    ``model`` is ``simulator`` or ``counts`` (what ``predictor`` fills in); ``aot``, if
    given, is ``aot(schedule, problem, tiling) -> {"ok": bool, ...}`` and drops candidates
    that do not compile for the GPU. ``jobs > 1`` rates candidates in that many processes
    (``predictor`` must then be a module-level function).
    """
    by = "simulator" if model == "simulator" else "counts"
    groups = groups_for(name)
    seqs_of, notes = _lengths(groups, hw)
    rated_groups = _rate_groups(groups, seqs_of, predictor, hw, by, jobs)
    return _assemble(name, hw, by, rated_groups, notes, aot, log)


def _rate_groups(groups: list[Group], seqs_of: dict, predictor: Predictor, hw, by: str,
                 jobs: int) -> list[RatedGroup]:
    """Rate every candidate of ``groups`` at each of their lengths; keep the legal ones
    (rated at every length)."""
    tasks = [(predictor, group.schedule, group.problem(n), t, hw, by)
             for group in groups for t in group.candidates() for n in seqs_of[group]]
    rated = map_tasks(_rate, tasks, jobs, chunksize=4)
    results = dict(zip(((t[1], t[2], t[3]) for t in tasks), rated, strict=True))
    now = _utc_now()
    rated_groups = []
    for group in groups:
        seqs = seqs_of[group]
        table, times, legal = [], [], []
        for t in group.candidates():
            cells = [results[(group.schedule, group.problem(n), t)] for n in seqs]
            if all(c is not None and c[0] is not None and c[0] > 0 for c in cells):
                table.append([c[0] for c in cells])
                times.append([c[1] for c in cells])
                legal.append(t)
        rated_groups.append(RatedGroup(group, seqs, legal, _transpose(table),
                                       _transpose(times), now))
    return rated_groups


def reselect_plan(plan: dict, hw, aot=None, log=lambda *_: None) -> dict:
    """The plan with its tilings chosen again, by ``choose``, from the candidate ratings it
    keeps — no model runs (a plan frozen by the simulator costs an hour to rate again).

    The groups, lengths and candidates must still be the matrix's; a plan whose candidates
    were rated by counts needs its expected times, which plans keep from 2026-11-30 on.
    """
    groups = {g.label: g for g in groups_for(plan["name"])}
    seqs_of, notes = _lengths(list(groups.values()), hw)
    rated_groups = _kept_groups(plan, groups, seqs_of)
    return _assemble(plan["name"], hw, plan["selected_by"], rated_groups, notes, aot, log)


def rerate_plan(plan: dict, hw, schedules: set[str], predictor: Predictor, model: str,
                aot=None, log=lambda *_: None, jobs: int = 1) -> dict:
    """The plan with the groups of ``schedules`` rated again by the model and every
    group's tilings chosen again; the other groups keep the ratings the plan has.

    For a model change that can only move the ratings of some schedules (the caller's
    claim; each group's ``rated_utc`` says when it was rated): an hour of rating is then
    minutes.
    """
    by = "simulator" if model == "simulator" else "counts"
    if by != plan["selected_by"]:
        raise ProblemError(f'plan "{plan["name"]}" was rated by {plan["selected_by"]}, the '
                           f"model here is {by}; write it again")
    groups = {g.label: g for g in groups_for(plan["name"])}
    unknown = schedules - {g.schedule for g in groups.values()}
    if unknown:
        raise ProblemError(f'plan "{plan["name"]}" has no groups of schedule '
                           f"{', '.join(sorted(unknown))}")
    seqs_of, notes = _lengths(list(groups.values()), hw)
    kept = _kept_groups(plan, groups, seqs_of)
    again = [rg.group for rg in kept if rg.group.schedule in schedules]
    fresh = {rg.group.label: rg for rg in
             _rate_groups(again, seqs_of, predictor, hw, by, jobs)}
    rated_groups = [fresh.get(rg.group.label, rg) for rg in kept]
    return _assemble(plan["name"], hw, by, rated_groups, notes, aot, log)


def _kept_groups(plan: dict, groups: dict, seqs_of: dict) -> list[RatedGroup]:
    """The plan's kept candidate ratings, checked against the matrix's groups."""
    if "candidate_ratings" not in plan:
        raise ProblemError(f'plan "{plan["name"]}" keeps no candidate ratings; write it again')
    rated_groups = []
    for entry in plan["candidate_ratings"]:
        group = groups.get(entry["group"])
        if group is None or entry["seqs"] != seqs_of[group]:
            raise ProblemError(f'plan "{plan["name"]}": group {entry["group"]} is not the '
                               "matrix's any more; write the plan again")
        legal = [Tiling.from_dict(t) for t in entry["tilings"]]
        candidates = group.candidates()
        if any(t not in candidates for t in legal):
            raise ProblemError(f'plan "{plan["name"]}": {entry["group"]} has tilings that are '
                               "no longer candidates; write the plan again")
        times = entry.get("times")
        if times is None:
            if plan["selected_by"] != "simulator":
                raise ProblemError(f'plan "{plan["name"]}" keeps no expected times; write it '
                                   "again")
            times = entry["ratings"]  # the simulator's ratings are its predicted times
        rated_groups.append(RatedGroup(group, entry["seqs"], legal,
                                       _transpose(entry["ratings"]), _transpose(times),
                                       entry.get("rated_utc", plan["created_utc"])))
    if len(rated_groups) != len(groups):
        raise ProblemError(f'plan "{plan["name"]}" does not rate every group of the matrix; '
                           "write it again")
    return rated_groups


def _assemble(name: str, hw, by: str, rated_groups: list[RatedGroup], notes: list[str], aot,
              log) -> dict:
    """Choose each group's tilings and lay out the plan (configs, peers, ratings)."""
    per_group, candidate_ratings = [], []
    for rg in rated_groups:
        group, seqs, legal, columns = rg.group, rg.seqs, rg.legal, rg.columns
        if group.probe:  # every legal tiling is measured; one that does not compile is dropped
            chosen, gap = _probe_compiles(group, seqs, legal, aot, notes, log), 1.0
        else:
            chosen, gap = choose(columns)
            if aot is not None:
                chosen, gap = _aot_filter(group, seqs, legal, columns, chosen, aot, notes, log)
        if gap < MIN_GAP:
            notes.append(f"{group.label}: the chosen tilings differ by only {100 * gap:.1f}% "
                         f"at some N (wanted {100 * MIN_GAP:.0f}%)")
        log(f"{group.label}: " + ", ".join(legal[i].describe() for i in chosen))
        candidate_ratings.append({
            "group": group.label, "seqs": seqs, "tilings": [t.to_dict() for t in legal],
            "ratings": _transpose(columns), "times": _transpose(rg.times),
            "chosen": chosen, "rated_utc": rg.rated_utc})
        per_group.append((group, seqs, [(legal[i], [row[i] for row in columns],
                                         [row[i] for row in rg.times],
                                         PROBE if group.probe else role_of(j))
                                        for j, i in enumerate(chosen)]))
    configs, peers, seen_problems = [], [], set()
    for n in SEQ_PRIORITY:
        for group, seqs, chosen in per_group:
            if n not in seqs:
                continue
            p = group.problem(n)
            for t, ratings, est, role in chosen:
                configs.append({
                    "id": config_id(group.schedule, p, t), "schedule": group.schedule,
                    "role": role,
                    "problem": p.to_dict(), "tiling": t.to_dict(),
                    "shape": config_id(group.schedule, p, None),
                    "kernels": kernel_names(group.schedule, p, t),
                    "compile_key": compile_key(group.schedule, p, t),
                    "rating": ratings[seqs.index(n)], "est_time_s": est[seqs.index(n)]})
            key = json.dumps(p.to_dict(), sort_keys=True)
            if key not in seen_problems:
                seen_problems.add(key)
                fastest = min(est[seqs.index(n)] for _, _, est, _ in chosen)
                peers += [{"id": config_id("", p, None, impl), "implementation": impl,
                           "problem": p.to_dict(), "shape": config_id(group.schedule, p, None),
                           "est_time_s": _peer_time_s(impl, p, fastest, hw)}
                          for impl in ("sdpa_math", "sdpa_flash")]
    plan = {"schema": PLAN_SCHEMA, "name": name, "hardware": hw.name, "selected_by": by,
            "rating": "predicted time_s" if by == "simulator" else "global bytes (exact counts)",
            "tilings_per_shape": TILINGS_PER_SHAPE, "min_gap": MIN_GAP,
            "close_call": CLOSE_CALL, "notes": notes,
            "created_utc": _utc_now(),
            "configs": configs, "peers": peers,
            # Every legal candidate's rating and expected time at every length, so that a
            # new selection rule can be applied to a frozen plan without rating the
            # candidates again (``reselect_plan``).
            "candidate_ratings": candidate_ratings}
    plan["sha256"] = plan_hash(plan)
    return plan


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _rate(task) -> tuple[float | None, float] | None:
    """(rating, expected time) of one candidate at one length; None if the model refuses it."""
    predictor, schedule, problem, tiling, hw, by = task
    try:
        pred = predictor(problem, tiling, schedule, hw)
    except ProblemError:
        return None
    return rating(pred, by), _time_s(pred, hw)


def _time_s(pred: dict, hw) -> float:
    """Expected kernel time for sizing the run: the simulator's, else a count roofline."""
    from validation.estimate import roofline_time

    return pred.get("time_s") or roofline_time(pred, hw)


def _peer_time_s(impl: str, p: AttentionProblem, fastest_s: float, hw) -> float:
    """MATH is a naive attention (its N x N tensors dominate); FLASH is about our best."""
    if impl != "sdpa_math":
        return fastest_s
    from simulator.prediction import count_prediction

    return 1.5 * _time_s(count_prediction(p, Tiling(block_m=64, block_n=64), "naive", hw), hw)


def _probe_compiles(group, seqs, legal, aot, notes, log) -> list[int]:
    """The indices of a probe's tilings that compile for sm_90 (all, without ``aot``)."""
    kept = []
    for i, tiling in enumerate(legal):
        if aot is None or aot(group.schedule, group.problem(seqs[-1]), tiling)["ok"]:
            kept.append(i)
        else:
            notes.append(f"{group.label}: {tiling.describe()} does not compile for sm_90")
            log(notes[-1])
    return kept


def _aot_filter(group, seqs, legal, columns, chosen, aot, notes, log):
    """Replace chosen tilings that do not compile for sm_90 (checked at the largest N)."""
    failed: set[int] = set()
    while True:
        bad = [i for i in chosen if i not in failed
               and not aot(group.schedule, group.problem(seqs[-1]), legal[i])["ok"]]
        if not bad:
            return chosen, _min_gap(tuple(chosen[:TILINGS_PER_SHAPE]), columns)
        failed.update(bad)
        for i in bad:
            notes.append(f"{group.label}: {legal[i].describe()} does not compile for sm_90")
            log(notes[-1])
        keep = [i for i in range(len(legal)) if i not in failed]
        sub = [[row[i] for i in keep] for row in columns]
        picked, _ = choose(sub)
        chosen = [keep[i] for i in picked]


def compile_check_configs(plans: list[dict]) -> list[dict]:
    """One config per distinct launch key of ``plans`` (``validation.compile.launch_key``:
    the compile key and Triton's specialization of the integers), the one with the longest
    K/V (as ``_aot_filter`` checks: the largest N of a group)."""
    from validation.compile import launch_key

    chosen: dict[str, dict] = {}
    for plan in plans:
        for cfg in plan["configs"]:
            key = launch_key(cfg)
            if key not in chosen or cfg["problem"]["seq_kv"] > chosen[key]["problem"]["seq_kv"]:
                chosen[key] = cfg
    return list(chosen.values())


def _aot_task(cfg: dict) -> tuple[str, dict]:
    from validation.compile import aot_check

    return cfg["compile_key"], aot_check(cfg["schedule"],
                                         AttentionProblem.from_dict(cfg["problem"]),
                                         Tiling.from_dict(cfg["tiling"]))


def check_plan_compiles(plans: list[dict], jobs: int = 1, log=print) -> list[str]:
    """Compile every kernel of the frozen plans for sm_90 with the Triton installed here;
    the failures, one line each. Run it when the GPU image's Triton is not the one that
    froze the plans (a tiling that fits one compiler's shared memory may not fit another's)."""
    import triton

    configs = compile_check_configs(plans)
    log(f"compiling {len(configs)} kernel sets for sm_90 with triton {triton.__version__}")
    failures = []
    for key, result in map_tasks(_aot_task, configs, jobs=jobs):
        if not result["ok"]:
            failures.append(f"{key}: {result['error']}")
            log(f"  FAILED {failures[-1]}")
    log(f"{len(configs) - len(failures)} of {len(configs)} compile and fit")
    return failures


def plan_hash(plan: dict) -> str:
    body = {k: plan[k] for k in ("name", "selected_by", "configs", "peers")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def load_plan(name_or_path: str) -> dict:
    """A frozen plan by matrix name (``validation/plans/<name>.json``) or by path."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = PLAN_DIR / f"{name_or_path}.json"
        if not path.is_file():
            groups_for(name_or_path)  # unknown names fail here with the list of known ones
            raise ProblemError(f"no frozen plan {path}; write it with `python -m "
                               f"validation.matrix write {name_or_path}`")
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProblemError(f"cannot read plan {path}: {exc}") from None
    check_plan(plan, path)
    return plan


_PLAN_FIELDS = {"name": str, "hardware": str, "selected_by": str, "rating": str,
                "notes": list, "configs": list, "peers": list, "sha256": str}


def check_plan(plan: object, path) -> None:
    """``ProblemError`` (one line) unless ``plan`` is a plan as ``write`` freezes it: its
    fields of the right types, every config and peer a valid problem (and tiling) with a
    finite positive time estimate, and its ``sha256`` that of its content (an edited plan
    would run, and its records claim, another plan than the one named)."""
    if not isinstance(plan, dict) or plan.get("schema") != PLAN_SCHEMA:
        raise ProblemError(f'{path} is not a plan (schema "{PLAN_SCHEMA}")')
    for key, kind in _PLAN_FIELDS.items():
        if not isinstance(plan.get(key), kind):
            raise ProblemError(f'plan {path}: "{key}" is missing or not a {kind.__name__}')
    for part in ("configs", "peers"):
        for i, item in enumerate(plan[part]):
            where = f"plan {path}: {part}[{i}]"
            if not isinstance(item, dict) or not all(
                    isinstance(item.get(k), str) for k in ("id", "shape")):
                raise ProblemError(f'{where} is not an object with an "id" and a "shape"')
            try:
                AttentionProblem.from_dict(item.get("problem"))
                if part == "configs":
                    Tiling.from_dict(item.get("tiling"))
            except (ProblemError, TypeError) as exc:
                raise ProblemError(f"{where} ({item['id']}): {exc}") from None
            if part == "configs" and item.get("schedule") not in SCHEDULE_NAMES:
                raise ProblemError(f'{where}: schedule {item.get("schedule")!r} is not one '
                                   f'of {", ".join(SCHEDULE_NAMES)}')
            est = item.get("est_time_s")
            if (not isinstance(est, (int, float)) or isinstance(est, bool)
                    or not math.isfinite(est) or est <= 0):
                raise ProblemError(f'{where}: "est_time_s" must be a finite number > 0, '
                                   f"got {est!r}")
    if plan["sha256"] != plan_hash(plan):
        raise ProblemError(f"plan {path} was edited after it was frozen: its sha256 "
                           f"{plan['sha256']} is not its content's {plan_hash(plan)}; "
                           "freeze it again (python -m validation.matrix reselect or write)")


def main(argv: list[str] | None = None) -> int:
    from simulator.cli.common import cores, write_atomically
    from simulator.hardware import load_hardware
    from validation import predict

    parser = argparse.ArgumentParser(prog="python -m validation.matrix",
                                     description="choose the tilings and freeze plans")
    parser.add_argument("action", choices=["write", "show", "reselect", "rerate", "compiles"],
                        help="write: rate the candidates and freeze; show: the same without "
                             "writing; reselect: choose again from a frozen plan's ratings; "
                             "rerate: rate the groups of --schedule again, keep the others' "
                             "ratings, choose again; compiles: check that every kernel of "
                             "the frozen plans compiles for sm_90 with this Triton")
    parser.add_argument("names", nargs="+", help="matrix names: default, quick, mlp")
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--jobs", type=int, default=cores(),
                        help="processes rating candidates (default: the cores this process "
                             "may use)")
    parser.add_argument("--schedule", action="append", default=[],
                        help="rerate: a schedule whose groups are rated again (repeatable)")
    parser.add_argument("--no-aot", action="store_true",
                        help="skip the sm_90 compile check of the chosen tilings")
    args = parser.parse_args(argv)
    if (args.action == "rerate") != bool(args.schedule):
        print("error: --schedule goes with rerate, and rerate needs at least one",
              file=sys.stderr)
        return 2
    if args.action == "compiles":
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("error: compiles needs the compiler: unset TRITON_INTERPRET", file=sys.stderr)
            return 2
        try:
            plans = [load_plan(name) for name in args.names]
        except ProblemError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 1 if check_plan_compiles(plans, jobs=args.jobs) else 0
    hw = load_hardware(args.hardware)
    aot = None
    if not args.no_aot and args.action != "show":
        from validation.compile import aot_check
        aot = aot_check
    for name in args.names:
        try:
            if args.action == "reselect":
                frozen = load_plan(name)
                plan = reselect_plan(frozen, load_hardware(frozen["hardware"]), aot=aot,
                                     log=print)
            elif args.action == "rerate":
                frozen = load_plan(name)
                plan = rerate_plan(frozen, load_hardware(frozen["hardware"]),
                                   set(args.schedule), predict.predict, predict.model_name(),
                                   aot=aot, log=print, jobs=args.jobs)
            else:
                plan = build_plan(name, hw, predict.predict, predict.model_name(), aot=aot,
                                  log=print, jobs=args.jobs)
        except ProblemError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: {len(plan['configs'])} configs, {len(plan['peers'])} peers, "
              f"tilings selected by {plan['selected_by']}")
        for note in plan["notes"]:
            print(f"  note: {note}")
        if args.action != "show":
            PLAN_DIR.mkdir(exist_ok=True)
            text = json.dumps(plan, indent=1) + "\n"
            write_atomically(PLAN_DIR / f"{name}.json", lambda p, t=text: p.write_text(t))
            print(f"  wrote {PLAN_DIR / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
