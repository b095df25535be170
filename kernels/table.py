"""Compile facts shipped with tilesim: the Triton kernels compiled ahead of time, once.

``--compiled-resources`` compiles a schedule's kernels for the preset's GPU (``resources``):
it needs Triton and takes seconds a kernel, minutes for a sweep. Without it the simulator
estimates registers from the tiles (``simulator.occupancy``) and knows no instruction
counts or spills, and a sweep then ranks first tilings that spill: FA2's forward at
d = 128 with 128 x 64 tiles and 4 warps compiles to 255 registers and spills 372 bytes a
thread every iteration, which the estimate (234 registers) does not see, and on the H200
it ran 33-42% slower than predicted without its compile (BENCHMARKS.md).

This module keeps a table of compiles made here with one Triton version per GPU
architecture (``TABLES``: JSON Lines, gzip, ``resources.measure``'s results by job key,
which names the architecture), covering the kernels and launches of ``VARIANTS_OF`` over
the whole tiling space ``tilesim sweep`` searches. A lookup gives a job's result exactly as a
compile with that Triton would: each table holds the hash of the kernel sources it was
compiled from (``resources.sources_digest``) and is not used once they change
(``tests/test_kernel_table.py`` fails then: rebuild it).

What the tables cover (``VARIANTS_OF``: on sm_90 FA2's forward and backward, with GQA, at
lengths on and off the multiples of 16, and at head_dim 256 (its backward without GQA),
FA1's forward, naive attention's kernels, split-KV decode's; on sm_80 most of those),
which compiles stand in for which (``STAND_IN``: fp16 for bf16 where only bf16 is
compiled; ``HEADS_STAND_IN``: 16 query heads for other counts but 1), what samples
compiled here showed of those stand-ins, and what each build cost:
docs/table-of-compiles.md. Any other launch, kernel, dtype or arch is looked up and not
found, and the estimate stands.

    python -m kernels.table build        # under Triton 3.6.0, the H200 records' version
    python -m kernels.table build --arch 80
    python -m kernels.table check-stand-in [--arch 80] [--samples N]
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

from kernels import resources
from kernels.compile_order import measured_evenly
from traces.tiling import Tiling

COMPILED = Path(__file__).resolve().parent / "compiled"
# One table per GPU architecture, each with its own header (Triton version, sources hash)
# and variants (``VARIANTS_OF``): sm_90 (H100, H200) and sm_80 (A100).
TABLES = {90: COMPILED / "sm90.jsonl.gz", 80: COMPILED / "sm80.jsonl.gz"}
ARCH = 90  # the architecture a call names none of: the H200 records' Hopper
SCHEMA = "tilesim.kernel_table/1"
# The launch the table is compiled as: every integer argument a multiple of 16, group 1.
LAUNCH = {"seq_q": 4096, "seq_kv": 4096, "heads": 16, "group": 1, "decode_rows": 16}
# naive_softmax holds a whole row of scores in registers, ROW = the key length rounded up to
# a power of two: one compile per row width, launched with that many queries and keys.
SOFTMAX_ROWS = tuple(2 ** i for i in range(4, 18))  # 16 to 131072
# A dtype whose compile another's row stands for, where the table lacks its own
# (docs/table-of-compiles.md): fp16's backward kernels (on sm_80 its forward too), from
# their bf16 compiles.
STAND_IN = {"fp16": "bf16"}
# The query heads whose compile stands for any other count but 1 and the multiples of 16.
HEADS_STAND_IN = 16
# The group size (query heads per K/V head) the GQA variants are compiled with: Triton
# specializes it on being 1 or a multiple of 16, so one compile serves 2 to 15 and their
# like (the groups of Llama's and Mistral's GQA: 4, 5, 8).
GQA_GROUP = 4
# The sequence length the variants off the multiples of 16 are compiled at: Triton
# specializes a length only on being 1 or a multiple of 16, so one compile serves every
# other length (1000, 1023, 4095, ...) where queries and keys both have it.
OFF_16_SEQ = 1000
FA2_BACKWARD = ("fa2_bwd_preprocess", "fa2_bwd_dq", "fa2_bwd_dkdv")
NAIVE_MATMULS = ("naive_qk", "naive_pv")
NAIVE_BACKWARD = ("naive_bwd_dv", "naive_bwd_dp", "naive_bwd_ds", "naive_bwd_dq",
                  "naive_bwd_dk")
BOTH_DTYPES, BF16 = ("bf16", "fp16"), ("bf16",)


DEFAULT_HEAD_DIMS = (64, 128)

# How Triton specializes an integer argument at launch (``resources.launch_ints``): 1 (a
# constexpr), a multiple of 16, or neither. Decode's compile depends on the class of its
# key length, split count and chunk (K/V blocks a split), not on their values.
ONE, ON_16, OFF_16 = "1", "on 16", "off 16"
INT_CLASSES = (ONE, OFF_16, ON_16)
# Decode's launch: one query a head (``n_q`` 1, a constexpr), as in generation. Its
# ``block_m`` is no constexpr of either kernel; ``tilesim sweep`` names 128.
DECODE_QUERIES, DECODE_BLOCK_M = 1, 128
DECODE_KERNELS = ("decode_split", "decode_reduce")


def _variants(kernels, dtypes, causal=(False, True), head_dims=DEFAULT_HEAD_DIMS, **launch):
    """One variant per kernel, head dim, dtype and mask (in that order), each with the
    launch entries ``launch`` (``group``, ``seq``, ``kv_seq``) that ``variant_shape`` reads."""
    return [{"kernel": kernel, "head_dim": d, "dtype": dtype, "causal": masked, **launch}
            for kernel, d, dtype, masked in itertools.product(kernels, head_dims, dtypes,
                                                              causal)]


def _naive_softmax(seq_of_row) -> list[dict]:
    """naive_softmax at every row width of ``SOFTMAX_ROWS``, launched with
    ``seq_of_row(row)`` queries and keys; it knows no head_dim (128 is compiled)."""
    return [v for row in SOFTMAX_ROWS
            for v in _variants(("naive_softmax",), BOTH_DTYPES, head_dims=(128,),
                               seq=seq_of_row(row))]


def int_class(n: int) -> str:
    """The specialization Triton gives an integer argument of value ``n`` (``INT_CLASSES``)."""
    return ONE if n == 1 else ON_16 if n % 16 == 0 else OFF_16


def _splits_of(blocks: int, split: str, chunk: str) -> int | None:
    """A split count of ``blocks`` K/V blocks of the class ``split`` whose chunk
    (``ceil(blocks / splits)`` blocks a split) is of the class ``chunk``, no chunk left
    empty (as ``kernels.decode.check`` asks); None if there is none. The splits that leave
    none empty with chunks of ``c`` blocks are ``ceil(blocks / c)``."""
    chunks = {ONE: range(1, 2), ON_16: range(16, blocks + 1, 16),
              OFF_16: (c for c in range(2, blocks + 1) if c % 16)}[chunk]
    for per_split in chunks:
        splits = -(-blocks // per_split)
        if -(-blocks // splits) == per_split and int_class(splits) == split:
            return splits
    return None


@functools.cache
def decode_launch(keys: str, split: str, chunk: str) -> tuple[int, dict[int, int]]:
    """(key length, split count by block_n of ``BLOCKS``) of decode launches whose key
    length, split count and chunk are of the classes ``keys`` (``ON_16`` or ``OFF_16``),
    ``split`` and ``chunk`` at every block_n: the shortest such length (a multiple of 16,
    or one key short of it), and at each block_n the split count of the smallest chunk
    of its class."""
    for sixteens in itertools.count(1):
        n_kv = 16 * sixteens - (keys == OFF_16)
        splits = {}
        for bn in sorted(BLOCKS, reverse=True):  # the fewest blocks first: they fail first
            splits[bn] = _splits_of(-(-n_kv // bn), split, chunk)
            if splits[bn] is None:
                break
        else:
            return n_kv, {bn: splits[bn] for bn in BLOCKS}
    raise AssertionError("unreachable")  # itertools.count does not end


def _decode_variants(causal=(False, True)) -> list[dict]:
    """decode_split at head_dim 64 and 128, bf16, groups 1 and ``GQA_GROUP``, keys on and
    off the multiples of 16, over every class of its split count and chunk; decode_reduce,
    which knows neither keys nor chunks, over the split count's."""
    variants = []
    for d, group, masked, split in itertools.product(DEFAULT_HEAD_DIMS, (1, GQA_GROUP),
                                                     causal, INT_CLASSES):
        base = {"head_dim": d, "dtype": "bf16", "causal": masked, "group": group,
                "seq_q": DECODE_QUERIES, "split": split}
        variants += [{"kernel": "decode_split", **base, "keys": keys, "chunk": chunk}
                     for keys, chunk in itertools.product((ON_16, OFF_16), INT_CLASSES)]
        variants.append({"kernel": "decode_reduce", **base, "keys": ON_16, "chunk": ONE})
    return variants


VARIANTS = (_variants(("fa2_fwd",), BOTH_DTYPES)
            + _variants(FA2_BACKWARD, BF16)
            # naive attention's forward: its matmuls know no mask (one compile serves
            # causal and not), its softmax knows no head_dim
            + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,))
            + _naive_softmax(lambda row: row)
            # and its backward's five kernels (no mask either), in bf16 as FA2's
            + _variants(NAIVE_BACKWARD, BF16, causal=(False,))
            # FA2's forward and backward with GQA: K/V heads shared by GQA_GROUP query
            # heads (since 2026-12-06; dK/dV loops over the group)
            + _variants(("fa2_fwd", "fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP)
            # FA2 at lengths that are not multiples of 16 (since 2026-12-06): its forward
            # as above, its backward in bf16
            + _variants(("fa2_fwd",), BOTH_DTYPES, seq=OFF_16_SEQ)
            + _variants(FA2_BACKWARD, BF16, seq=OFF_16_SEQ)
            # naive attention there (since 2026-12-06): its matmuls as above; its softmax
            # at every row width, launched one key short of it (ROW is the key length
            # rounded up to a power of two); its backward
            + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,), seq=OFF_16_SEQ)
            + _naive_softmax(lambda row: row - 1)
            + _variants(NAIVE_BACKWARD, BF16, causal=(False,), seq=OFF_16_SEQ)
            # FA2's forward with GQA there (since 2026-12-06): prefill of a prompt as it
            # comes, the commonest launch of a GQA model; and its backward's dQ and dK/dV
            # (since 2026-12-06, fourteenth session): fine-tuning on sequences as they come
            + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, seq=OFF_16_SEQ)
            + _variants(("fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP,
                        seq=OFF_16_SEQ)
            # FA2's forward with queries at a multiple of 16 and keys off them, with and
            # without GQA: causal (since 2026-12-06, fourteenth session), a chunk of a
            # prompt after a cached prefix of any length (chunked prefill); and not
            # (fifteenth session), cross-attention to an encoder's output (Whisper's
            # 448 decoder positions to its 1500 audio frames)
            + _variants(("fa2_fwd",), BF16, kv_seq=OFF_16_SEQ)
            + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, kv_seq=OFF_16_SEQ)
            # FA1's forward (since 2026-12-06, fourteenth session), so that it and FA2
            # are predicted from compiles alike; in fp16 too, which compiles otherwise
            + _variants(("fa1_fwd",), BOTH_DTYPES)
            # FA2's forward at head_dim 256 (fifteenth session), with and without GQA:
            # Gemma's heads, where a tile's accumulator alone fills a thread's registers
            + _variants(("fa2_fwd",), BF16, head_dims=(256,))
            + _variants(("fa2_fwd",), BF16, head_dims=(256,), group=GQA_GROUP)
            # and its backward's three kernels there (twenty-fifth session), group 1:
            # fine-tuning Gemma, where every tile of dK/dV holds 256-wide rows
            + _variants(FA2_BACKWARD, BF16, head_dims=(256,))
            # split-KV decode (since 2026-12-07, twenty-third session): one query a head,
            # without and with GQA, over every specialization of its integers
            + _decode_variants())

# sm_80 (the A100 presets; sixteenth session): FA2's forward and its backward's three
# kernels at head_dim 64 and 128, causal and not, in bf16 (fp16 takes them: ``STAND_IN``);
# with GQA (seventeenth session): Llama 2 70B's, Llama 3's and Mistral's attention; and
# (eighteenth session) FA2's forward at lengths off the multiples of 16, both (prefill
# of a prompt as it comes) or the keys' alone (chunked prefill, cross-attention), with and
# without GQA, and FA1's forward in both dtypes, as on sm_90; and (nineteenth session)
# FA2's backward at lengths off the multiples of 16 (training on samples as they come),
# and FA2's forward at head_dim 256 (Gemma), group 1; and (twentieth session) naive
# attention, forward and backward, at lengths on and off the multiples of 16, as on
# sm_90, so that `tilesim compare` on an A100 predicts both schedules from compiles; and
# (twenty-first session) FA2's dQ and dK/dV with GQA at lengths off the multiples of 16
# (fine-tuning a GQA model on samples as they come), as on sm_90; and (twenty-fourth
# session) split-KV decode, as on sm_90.
SM80_VARIANTS = (_variants(("fa2_fwd",), BF16)
                 + _variants(FA2_BACKWARD, BF16)
                 + _variants(("fa2_fwd", "fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP)
                 + _variants(("fa2_fwd",), BF16, seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, seq=OFF_16_SEQ)
                 + _variants(FA2_BACKWARD, BF16, seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, kv_seq=OFF_16_SEQ)
                 + _variants(("fa2_fwd",), BF16, group=GQA_GROUP, kv_seq=OFF_16_SEQ)
                 + _variants(("fa1_fwd",), BOTH_DTYPES)
                 + _variants(("fa2_fwd",), BF16, head_dims=(256,))
                 + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,))
                 + _naive_softmax(lambda row: row)
                 + _variants(NAIVE_BACKWARD, BF16, causal=(False,))
                 + _variants(NAIVE_MATMULS, BOTH_DTYPES, causal=(False,), seq=OFF_16_SEQ)
                 + _naive_softmax(lambda row: row - 1)
                 + _variants(NAIVE_BACKWARD, BF16, causal=(False,), seq=OFF_16_SEQ)
                 + _variants(("fa2_bwd_dkdv", "fa2_bwd_dq"), BF16, group=GQA_GROUP,
                             seq=OFF_16_SEQ)
                 + _decode_variants())
VARIANTS_OF = {90: VARIANTS, 80: SM80_VARIANTS}


def variant_shape(variant: dict) -> dict:
    """``resources.measure``'s launch keywords of one variant: ``LAUNCH``, its mask, and
    its sequence lengths (``seq``: queries and keys; ``kv_seq``: keys alone; ``seq_q``:
    queries alone) and group size (``group``) where it has its own; decode's group tile
    (``decode_rows``) is its group's query rows. A decode variant's key length is each
    launch's own (``variant_launches``)."""
    seq = variant.get("seq")
    lengths = {} if seq is None else {"seq_q": seq, "seq_kv": seq}
    if "kv_seq" in variant:
        lengths["seq_kv"] = variant["kv_seq"]
    if "seq_q" in variant:
        lengths["seq_q"] = variant["seq_q"]
    group = {} if "group" not in variant else {"group": variant["group"]}
    shape = dict(LAUNCH, causal=variant["causal"], **lengths, **group)
    if variant.get("kernel") in DECODE_KERNELS:
        shape["decode_rows"] = shape["group"] * shape["seq_q"]
    return shape


def variant_launches(variant: dict) -> list[tuple[dict, Tiling]]:
    """The (launch keywords, tiling) pairs a variant is compiled as: ``variant_shape``
    over the sweep space; a decode variant over its block_n, stages and warps at the key
    length of its classes and each block_n's split count (``decode_launch``), ``block_m``
    ``DECODE_BLOCK_M``."""
    shape = variant_shape(variant)
    if variant["kernel"] not in DECODE_KERNELS:
        return [(shape, tiling) for tiling in sweep_space()]
    n_kv, splits = decode_launch(variant["keys"], variant["split"], variant["chunk"])
    return [(dict(shape, seq_kv=n_kv), Tiling(DECODE_BLOCK_M, bn, stages, warps, splits[bn]))
            for bn, stages, warps in itertools.product(BLOCKS, STAGES, WARPS)]


# ``tilesim sweep``'s tiling space (simulator.cli.sweep_cmd: BLOCKS, STAGES, WARPS).
BLOCKS, STAGES, WARPS = (16, 32, 64, 128, 256), (1, 2, 3, 4, 5), (4, 8)


def sweep_space() -> list[Tiling]:
    return [Tiling(bm, bn, st, w) for bm, bn, st, w in
            itertools.product(BLOCKS, BLOCKS, STAGES, WARPS)]


# A row's line as ``build`` writes it (``json.dumps`` with sorted keys): the key, JSON
# escaped, between these two; an unescaped quote cannot occur inside it.
_ROW_START, _ROW_KEY_END = '{"key": "', '", "result": '


def _load(arch: int = ARCH) -> tuple[dict, dict[str, str]]:
    """(header, JSON-escaped key -> its row's line) of the table of ``arch``
    (``TABLES``); ({}, {}) where there is none."""
    return _read(TABLES[arch]) if arch in TABLES else ({}, {})


@functools.lru_cache(maxsize=2)
def _read(path: Path) -> tuple[dict, dict[str, str]]:
    """The header, and each row's line by its key as the line has it (JSON-escaped). A
    row's result is parsed when it is looked up (``_result``): parsing all of them (some
    24 MB of JSON) took a quarter of a second, which every prediction command paid. A
    missing or damaged table is no table: the estimate stands (and the test of the table
    fails)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        header = json.loads(lines[0])
        rows = {}
        for line in lines[1:]:
            if not line.startswith(_ROW_START):
                raise ValueError("not a row")
            rows[line[len(_ROW_START):line.index(_ROW_KEY_END)]] = line
    except (OSError, EOFError, ValueError, IndexError):
        return {}, {}
    return (header, rows) if isinstance(header, dict) else ({}, {})


def _result(line: str) -> dict | None:
    """A row's result; None where the line is damaged (the estimate stands for it)."""
    try:
        result = json.loads(line)["result"]
    except (ValueError, KeyError, TypeError):
        return None
    return result if isinstance(result, dict) else None


def _all_rows(arch: int = ARCH) -> dict[str, dict]:
    """Every row of the table of ``arch`` whose result parses, key -> result (``build``
    keeps them; a damaged row is compiled again, as a lookup finds none)."""
    rows = {}
    for escaped, line in _load(arch)[1].items():
        result = _result(line)
        if result is not None:
            rows[json.loads(f'"{escaped}"')] = result
    return rows


def header(arch: int = ARCH) -> dict:
    """The first line of the table of ``arch``: schema, Triton version, sources digest,
    what it covers; {} where there is none."""
    return _load(arch)[0]


def current(arch: int = ARCH) -> bool:
    """Whether the table of ``arch`` was compiled from the kernel sources as they are now."""
    head = header(arch)
    return bool(head) and head.get("sources") == _sources_now()


@functools.lru_cache(maxsize=1)
def _sources_now() -> str:
    return resources.sources_digest()  # the files do not change under a running process


def lookup(key: str) -> dict | None:
    """The shipped result of job ``key`` (``resources.job_key``) from the table of the
    architecture the key names, or None: no table for it, not covered, or the table is
    stale."""
    arch = _key_arch(key)
    if arch is None or not current(arch):
        return None
    line = _load(arch)[1].get(json.dumps(key)[1:-1])
    return None if line is None else _result(line)


def _key_arch(key: str) -> int | None:
    """The architecture a job key names ("fa2_fwd/90/bf16/..."), None if none."""
    parts = key.split("/", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def problem_rows(problem, tiling: Tiling, names: list[str], arch: int = ARCH
                 ) -> dict[str, dict]:
    """The rows of the table of ``arch`` of the named kernels for one attention problem
    (a ``traces.problem.AttentionProblem``, launched as ``kernels`` launch it) and tiling,
    by kernel name: those it has (in the dtype that ``STAND_IN`` names where it has the
    problem's dtype not, at ``HEADS_STAND_IN`` query heads where it has the problem's
    not), none where it is stale; keyed as
    ``resources.schedule_resources`` compiles them."""
    shape = resources.problem_shape(problem)
    shapes = [shape]
    if shape["heads"] != 1 and shape["heads"] % 16:
        shapes.append(dict(shape, heads=HEADS_STAND_IN))
    dtypes = [problem.dtype] + ([STAND_IN[problem.dtype]] if problem.dtype in STAND_IN else [])
    rows = {}
    for name in names:
        if name not in resources.KERNELS:
            continue
        for dtype, launch in itertools.product(dtypes, shapes):
            row = lookup(resources.job_key(name, arch, dtype, problem.head_dim, tiling,
                                           **launch))
            if row is not None:
                rows[name] = row
                break
    return rows


def build(arch: int = ARCH, out: Path | None = None, workers: int | None = None) -> int:
    """Compile every variant of ``arch`` (``VARIANTS_OF``) over the sweep space
    (``resources.measure``, whose cache keeps what is done) and write its table
    (``TABLES``, or ``out``) atomically; returns the number of jobs. The rows of the table
    as it is are kept, not compiled again, where it is current and of this Triton: adding
    a variant compiles that variant alone."""
    import triton

    out = TABLES[arch] if out is None else out
    kept = (_all_rows(arch) if current(arch) and header(arch).get("triton") == triton.__version__
            else {})
    rows: dict[str, dict] = {}
    for v in VARIANTS_OF[arch]:
        launches = variant_launches(v)
        shape = launches[0][0]  # every launch of a variant has the same keywords
        keys = [resources.job_key(v["kernel"], arch, v["dtype"], v["head_dim"], tiling,
                                  **shape) for _, tiling in launches]
        rows.update({key: kept[key] for key in keys if key in kept})
        todo = [(key, tiling) for key, (_, tiling) in zip(keys, launches, strict=True)
                if key not in rows]
        if not todo:
            continue
        print(f"compiling {v} ...", file=sys.stderr, flush=True)
        results = measured_evenly(
            lambda tilings, v=v, shape=shape: resources.measure(
                [v["kernel"]], archs=(arch,), dtype=v["dtype"], head_dim=v["head_dim"],
                tilings=tilings, workers=workers, **shape),
            [tiling for _, tiling in todo])
        for (key, _), result in zip(todo, results, strict=True):
            rows[key] = result.to_dict()
    head = {"schema": SCHEMA, "triton": triton.__version__, "arch": arch,
            "sources": resources.sources_digest(), "launch": LAUNCH,
            "variants": VARIANTS_OF[arch], "command": _build_command(arch)}
    text = "\n".join([json.dumps(head, sort_keys=True)]
                     + [json.dumps({"key": k, "result": rows[k]}, sort_keys=True)
                        for k in sorted(rows)]) + "\n"
    _write_atomically(out, gzip.compress(text.encode("utf-8"), mtime=0))
    return len(rows)


def _build_command(arch: int) -> str:
    return "python -m kernels.table build" + ("" if arch == ARCH else f" --arch {arch}")


def _write_atomically(out: Path, data: bytes) -> None:
    """``data`` to ``out`` through a temporary file beside it and a rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep it from other users of a checkout
    os.replace(tmp, out)


def main(argv: list[str]) -> int:
    """``build`` or ``check-stand-in``, for sm_90 or ``--arch 80``; 2 on a bad command line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kernels.table")
    parser.add_argument("command", choices=("build", "check-stand-in"))
    parser.add_argument("--arch", type=int, choices=sorted(TABLES), default=ARCH)
    parser.add_argument("--samples", type=int, default=12,
                        help="check-stand-in: tilings drawn per launch (default 12)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"{build(args.arch)} compiles in {TABLES[args.arch]}")
    else:
        from kernels.table_check import check_stand_in

        print(json.dumps(check_stand_in(samples=args.samples, arch=args.arch), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
