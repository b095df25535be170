"""``tilesim race``: naive attention (N x N) against tiled online softmax, on this CPU."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "race", help="a real CPU race: naive N x N attention vs tiled online softmax (numba)",
        description="Wall time (median of repeats after a warm-up call), bytes allocated "
        "(tracemalloc, and explicit accounting of the numba tile buffers) and the max "
        "difference of the outputs, float64. A CPU has no HBM/SRAM split: this shows memory "
        "footprint and arithmetic, not HBM traffic.",
    )
    p.add_argument("--seq", default="256,1024,2048,4096",
                   help="comma-separated sequence lengths N (default 256,1024,2048,4096)")
    p.add_argument("--head-dim", default="64", help="head dim d (default 64)")
    p.add_argument("--tile", default="64", help="tile size of the numba kernel (default 64)")
    p.add_argument("--repeats", default="3", help="timed calls per function and N (default 3)")
    p.add_argument("--seed", default="0", help="seed of q, k, v (default 0)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--plot", metavar="FILE", help="write time and bytes over N to FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import print_json
    from simulator.explain.common import check_plot_path, parse_int, parse_int_list, parse_seed

    seqs = parse_int_list(args.seq, "seq")
    head_dim = parse_int(args.head_dim, "head_dim")
    tile = parse_int(args.tile, "tile")
    repeats = parse_int(args.repeats, "repeats")
    seed = parse_seed(args.seed)
    check_plot_path(args.plot)

    from rich.console import Console

    from simulator.cli.common import output_console
    from simulator.explain import race  # numba: imported only once the input is known good

    with Console(stderr=True).status("racing ...") as status:
        result = race.race(
            seqs, head_dim=head_dim, tile=tile, repeats=repeats, seed=seed,
            progress=lambda seq: status.update(f"racing N={seq:,} ({repeats} repeats) ..."),
        )
    if args.plot:
        race.plot(result, args.plot)
    if args.json:
        print_json(result)
    else:
        output_console().print(race.render(result))
    return 0
