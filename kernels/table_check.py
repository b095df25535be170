"""Checking the table's stand-ins: compile a sample of what a row stands for, and compare.

A row of tilesim's table of compiles (``kernels.table``) stands in for compiles it does not
hold: fp16 where only bf16 is compiled (``STAND_IN``), other head counts but 1 where 16
is (``HEADS_STAND_IN``). ``check_stand_in`` compiles a seeded sample of tilings of each
such launch and reports, per stand-in, kernel and launch, the facts that differ and by how
much (what it found: docs/table-of-compiles.md).

    python -m kernels.table check-stand-in [--arch 80] [--samples N]
"""

from __future__ import annotations

from kernels import resources
from kernels.table import (
    ARCH,
    DEFAULT_HEAD_DIMS,
    STAND_IN,
    VARIANTS_OF,
    lookup,
    variant_launches,
)


def check_stand_in(samples: int = 12, seed: int = 6, workers: int | None = None,
                   arch: int = ARCH) -> dict:
    """Compile for ``arch`` ``samples`` tilings (drawn with ``seed`` from the sweep space)
    of each launch a row of its table stands for and compare the compile's facts with that row
    (docs/table-of-compiles.md): per stand-in ("fp16": the kernels the table holds only in bf16,
    compiled in fp16; "heads 12": every bf16 kernel that takes the head count, at 12 query
    heads) and kernel (with its launch's group, lengths or head dim where they are its
    own: ``_launch_label``), the jobs compared, and per fact that differed, how many and the
    range of compiled / table; ``no_row`` counts the jobs the table has no row to compare
    with (a stale table, or a variant not built yet)."""
    import random

    # (stand-in, variant whose row stands in, its launches, dtype and shape compiled)
    cases = []
    variants = VARIANTS_OF[arch]
    for v in variants:
        launches = variant_launches(v)
        shape = launches[0][0]  # every launch of a variant has the same keywords
        for dtype, stand_in in STAND_IN.items():
            if v["dtype"] == stand_in and dict(v, dtype=dtype) not in variants:
                cases.append((dtype, v, launches, dtype, shape))
        if v["dtype"] == "bf16" and "n_heads" in resources._int_arg_names(v["kernel"]):
            cases.append(("heads 12", v, launches, "bf16", dict(shape, heads=12)))
    report: dict[str, dict] = {}
    for case, v, launches, dtype, shape in cases:
        own = launches[0][0]
        # the same draw for every variant (a decode variant's tilings carry its splits)
        tilings = random.Random(seed).sample([t for _, t in launches], samples)
        compiled = resources.measure([v["kernel"]], archs=(arch,), dtype=dtype,
                                     head_dim=v["head_dim"], tilings=tilings,
                                     workers=workers, **shape)
        entry = report.setdefault(case, {}).setdefault(launch_label(v),
                                                       {"jobs": 0, "differ": {}})
        for tiling, result in zip(tilings, compiled, strict=True):
            row = lookup(resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"],
                                           tiling, **own))
            if row is None:  # stale, or not built yet: nothing to compare with, said so
                entry["no_row"] = entry.get("no_row", 0) + 1
                continue
            entry["jobs"] += 1
            tally_differences(entry["differ"], result.to_dict(), row)
    return report


def launch_label(variant: dict) -> str:
    """A variant's kernel, and the launch it is compiled as where that is not ``LAUNCH``'s,
    and its head dim where that is not one of ``_variants``' own (64, 128): "fa2_bwd_dq",
    "fa2_bwd_dq group 4", "fa2_fwd seq 1000", "fa2_fwd kv_seq 1000", "fa2_fwd d 256"."""
    extra = [f"{name} {variant[name]}" for name in ("group", "seq", "kv_seq", "seq_q",
                                                     "keys", "split", "chunk")
             if name in variant]
    if variant["head_dim"] not in DEFAULT_HEAD_DIMS:
        extra.append(f"d {variant['head_dim']}")
    return " ".join([variant["kernel"], *extra])


def tally_differences(differ: dict, mine: dict, row: dict) -> None:
    """Add to ``differ`` (fact -> {"jobs", "ratio": (least, most) of mine / row}) each fact
    of a compile ``mine`` that differs from the ``row`` standing in for it; the tiling's
    own fields aside (a compile shared by tilings names its first)."""
    for fact, value in row.items():
        if fact in ("dtype", "block_m", "block_n", "num_stages", "num_warps") \
                or mine.get(fact) == value:
            continue
        d = differ.setdefault(fact, {"jobs": 0, "ratio": None})
        d["jobs"] += 1
        if isinstance(value, (int, float)) and value and \
                isinstance(mine.get(fact), (int, float)):
            r = mine[fact] / value
            lo, hi = d["ratio"] or (r, r)
            d["ratio"] = (min(lo, r), max(hi, r))
