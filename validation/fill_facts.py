"""Main-loop facts a record lacks, from tilesim's table of compiles (what ``tilesim
reconcile`` and ``calibrate`` do by default) or a compile here (``--fill-loop-facts``).

A record's ``kernel_facts`` are what the device's own Triton made of each kernel. Records
made before the device run read the main loop's SASS (``kernels.resources.main_loop``:
instructions a warp issues per iteration, the spill bytes a thread loads and stores, the
waits for the reloads; since 2026-12-04, the instructions a warp issues in a kernel
without loops, ``kernels.resources.straight_instructions``; since 2026-12-05, those it
issues outside the loops of a kernel with loops, ``outside_loop_instructions``, and per
iteration of its main loop's masked copy, ``masked_loop_instructions``) carry registers
and shared memory but not those, so the model times their spilling kernels as if nothing spilled
(the H200 records of 2026-11-30: FA2's forward at d = 128, 128 x 64, 4 warps, and dK/dV at
255 registers; BENCHMARKS.md, "Register spills") and their warps as if they could go
through any number of instructions (``simulator.sim.program.issue_floor_s``).

``fill_loop_facts`` compiles the same kernels and tilings ahead of time here (cached, as
``tilesim kernels resources``) and copies the loop facts into the records that lack them,
for each kernel whose compile here has exactly the registers the device's had: a kernel
given other registers spills otherwise. The Triton here need not be the device's, so the
facts are the compiler's in kind, not the device's to the byte, unless the Triton here is
the version the device ran (``compilers``: Triton bundles its own ``ptxas``, so the same
version compiles the same SASS; ``pip install triton==<the records' version>`` in a
separate environment gives it). Records whose kernels are all in tilesim's table of
compiles (``kernels.table``), compiled by the Triton their device ran, take its rows
instead: the device's facts with no compile (every kernel of the H200 records, since
decode joined the table on 2026-12-07). The table's rows are what the prediction commands
(``simulate``, ``sweep``, ``compare``) use for the same launch, so ``reconcile`` and
``calibrate`` take them by default: a record is predicted with the compile facts
``simulate`` takes for its config; ``--fill-loop-facts`` compiles here what the table
lacks, ``--as-recorded`` takes the records' facts alone. The reconcile report says how many
records were filled, from where, with which Triton against the device's, and records that
carry their own are never touched.
"""

from __future__ import annotations

import copy
from collections import defaultdict

from traces.problem import AttentionProblem, ProblemError
from traces.tiling import Tiling

LOOP_FACTS = ("loop_instructions", "spill_load_bytes_per_iteration",
              "spill_store_bytes_per_iteration", "spill_reload_waits", "straight_instructions",
              "prologue_instructions", "epilogue_instructions", "masked_loop_instructions")
# Copied with them: the stack frame, which the records made before 2026-12-02 read from
# ``LOCAL`` alone, 0 for a kernel that spills (``kernels.resources._cuobjdump_usage``); the
# spills' L1 hits depend on it (``simulator.spills``).
FRAME_FACTS = ("spill_bytes",)


def _lacks_loop_facts(rec: dict) -> bool:
    facts = rec.get("kernel_facts") or ()
    return (rec.get("implementation") == "triton" and bool(facts)
            and all(all(f.get(key) is None for key in LOOP_FACTS) for f in facts))


def _arch(rec: dict) -> int | None:
    """The compute capability the record's GPU has (``"9.0"`` -> 90), if the kernels
    compile for it here (sm_80, sm_90)."""
    from kernels.resources import MAX_SHARED_BYTES

    capability = str((rec.get("environment") or {}).get("gpu_capability") or "")
    arch = int(capability.replace(".", "")) if capability.replace(".", "").isdigit() else None
    return arch if arch in MAX_SHARED_BYTES else None


def compilers(records: list[dict]) -> dict:
    """Which Triton fills the loop facts here and which the records' device compiled them
    with: ``{"here": version, "device": [versions of the records that lack loop facts,
    "unknown" where a record does not say], "same": whether those are all the version
    here}``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        here = version("triton")
    except PackageNotFoundError:
        here = None
    device = sorted({(rec.get("environment") or {}).get("triton") or "unknown"
                     for rec in records if _lacks_loop_facts(rec)})
    return {"here": here, "device": device, "same": here is not None and device == [here]}


def fill_saying_how(records: list[dict], progress=None,
                    compile_here: bool = True) -> tuple[list[dict], dict]:
    """``fill_loop_facts``, with what the commands say of it: ``(records, filled)`` where
    ``filled`` is ``compilers`` of the records compiled here (as read), plus ``"records"``,
    how many gained facts, ``"table"``, how many of those from tilesim's table of compiles,
    ``"table_triton"``, the Triton it was compiled with, and ``"compiled_here"``, whether
    records the table does not serve were compiled here (``compile_here``)."""
    from kernels import table

    served: set[int] = set()
    out, count = fill_loop_facts(records, progress=progress, served=served,
                                 compile_here=compile_here)
    from_table = sum(1 for i in served if out[i] is not records[i])
    said = compilers([rec for i, rec in enumerate(records) if i not in served])
    archs = {_arch(rec) for i, rec in enumerate(records) if i in served}
    return out, dict(said, records=count, table=from_table, compiled_here=compile_here,
                     table_triton=table.header(archs.pop() if len(archs) == 1
                                               else table.ARCH).get("triton"))


def sources_phrase(filled: dict, table: str, compiled: str) -> str:
    """Where ``fill_saying_how``'s ``filled`` says the facts came from, in the caller's
    words for each source: ``table`` (tilesim's table of compiles), ``compiled`` (a compile
    here), or both with how many records each gave."""
    from_table, records = filled.get("table") or 0, filled.get("records") or 0
    if not from_table:
        return compiled
    if from_table == records:
        return table
    return f"{table} for {from_table}, {compiled} for {records - from_table}"


def fill_loop_facts(records: list[dict], progress=None, served: set[int] | None = None,
                    compile_here: bool = True) -> tuple[list[dict], int]:
    """``(records, filled)``: the records with loop facts added to the kernel facts of the
    Triton records that have none (copies; the others as they were), and how many records
    gained any. Each takes them from tilesim's table of compiles (``kernels.table``) where
    it has every kernel of the record and was compiled with the Triton the record's device
    ran, for its architecture: the device's own facts, with no compile; the others from a
    compile here for their GPU's architecture, or, without ``compile_here`` (what
    ``tilesim reconcile`` and ``calibrate`` do by default), as they are. ``progress(done,
    total)`` hears of each
    problem compiled; ``served``, where given, gains the index of each record the table
    served (whether or not its facts took). ``ProblemError`` (one line) when some record
    needs a compile and nothing can be compiled here (no torch or triton)."""
    from kernels import resources  # imports neither torch nor triton

    out, filled = list(records), 0
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, rec in enumerate(records):
        if (rows := _table_rows(rec)) is not None:
            if served is not None:
                served.add(i)
            if (gained := _with_facts(rec, rows)) is not None:
                out[i], filled = gained, filled + 1
        elif compile_here and _lacks_loop_facts(rec) and (arch := _arch(rec)) is not None:
            problem = dict(rec["problem"], batch=1)  # the batch only sizes the grid
            groups[(arch, tuple(sorted(problem.items())))].append(i)
    if groups:
        resources.require_compiler("--fill-loop-facts")
    for done, ((arch, problem_items), members) in enumerate(groups.items(), start=1):
        problem = AttentionProblem.from_dict(dict(problem_items))
        tilings = [Tiling.from_dict(records[i]["tiling"]) for i in members]
        names = sorted({f["name"] for i in members for f in records[i]["kernel_facts"]})
        try:
            per_tiling = resources.schedule_resources(problem, tilings, names, arch)
        except ValueError:  # a kernel without a twin here, a head_dim none compiles
            continue
        except ImportError as exc:  # installed, but broken
            raise ProblemError(f"--fill-loop-facts: cannot import {exc.name or 'triton'}: "
                               f"{exc}") from None
        except RuntimeError as exc:  # the compile workers failed
            raise ProblemError(f"--fill-loop-facts: {exc}") from None
        for i, rows in zip(members, per_tiling, strict=True):
            gained = _with_facts(records[i], {name: r.to_dict() for name, r in rows.items()})
            if gained is not None:
                out[i], filled = gained, filled + 1
        if progress is not None:
            progress(done, len(groups))
    return out, filled


def _table_rows(rec: dict) -> dict[str, dict] | None:
    """For a record that lacks loop facts, the rows of tilesim's table of compiles for
    every kernel of it, by name, where the table is for its GPU's architecture, was
    compiled with the Triton its device ran (which bundles its ptxas: the same SASS) and
    has them all; else None."""
    from kernels import table

    arch = _arch(rec)
    if not _lacks_loop_facts(rec) or arch is None or not table.current(arch):
        return None
    if (rec.get("environment") or {}).get("triton") != table.header(arch).get("triton"):
        return None
    try:
        problem = AttentionProblem.from_dict(rec["problem"])
        tiling = Tiling.from_dict(rec["tiling"])
    except (ProblemError, KeyError, TypeError, ValueError):
        return None
    names = [f["name"] for f in rec["kernel_facts"]]
    rows = table.problem_rows(problem, tiling, names, arch)
    return rows if len(rows) == len(set(names)) else None


def _with_facts(rec: dict, rows: dict[str, dict]) -> dict | None:
    """A copy of the record whose kernel facts took the loop facts (and the stack frame,
    ``FRAME_FACTS``) of their compile (``rows``: kernel name -> ``KernelResources.to_dict()``),
    each only where that compile gave the kernel the device's registers; None where none
    gained any."""
    out = copy.deepcopy(rec)
    gained = False
    for fact in out["kernel_facts"]:
        row = rows.get(fact["name"])
        if (row is None or row.get("error") or row.get("registers") is None
                or row["registers"] != fact.get("registers")):
            continue
        for key in LOOP_FACTS + FRAME_FACTS:
            fact[key] = row.get(key)
        gained = gained or any(fact[key] is not None for key in LOOP_FACTS)
    return out if gained else None
