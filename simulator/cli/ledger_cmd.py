"""``tilesim ledger``: one score row through the online softmax, tile by tile."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ledger", help="the online-softmax ledger of one score row, and the no-rescale failure",
        description="Stream one row of scores tile by tile: running max, running sum and "
        "rescale factor per tile, agreement with the full softmax (float64), and the streamer "
        "that skips the rescale on a row whose later tile brings a larger max.",
    )
    p.add_argument("--seq", default="64", help="length of the score row (default 64)")
    p.add_argument("--tile", default="16", help="tile length (default 16)")
    p.add_argument("--seed", default="0", help="seed of the demo row (default 0)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--plot", metavar="FILE", help="write the ledger plot to FILE (.png/.svg)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import print_json
    from simulator.explain import ledger
    from simulator.explain.common import check_plot_path, parse_int, parse_seed

    seq, tile = parse_int(args.seq, "seq"), parse_int(args.tile, "tile")
    seed = parse_seed(args.seed)
    check_plot_path(args.plot)
    result = ledger.ledger(seq=seq, tile=tile, seed=seed)
    if args.plot:
        ledger.plot(result, args.plot)
    if args.json:
        print_json(result)
    else:
        from simulator.cli.common import output_console

        output_console().print(ledger.render(result))
    return 0
