"""``tilesim bill``: the N x N score-matrix traffic bill of naive attention, per head."""

from __future__ import annotations

import argparse

from traces.problem import DTYPE_BYTES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bill", help="bytes the naive N x N score matrix costs per head, against its FLOPs",
        description="Per head: the S bill 2*N^2*s (S written and read back) and the S+P total "
        "4*N^2*s, against the forward FLOPs 4*N^2*d and the Q,K,V,O bytes 4*N*d*s.",
    )
    p.add_argument("--seq", default="512,2048,8192,32768",
                   help="comma-separated sequence lengths N (default 512,2048,8192,32768)")
    p.add_argument("--head-dim", default="128", help="head dim d (default 128)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="fp16")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--plot", metavar="FILE", help="write the curves over N to FILE (.png/.svg)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.cli.common import print_json
    from simulator.explain import bill
    from simulator.explain.common import check_plot_path, parse_int, parse_int_list

    seqs = parse_int_list(args.seq, "seq")
    head_dim = parse_int(args.head_dim, "head_dim")
    check_plot_path(args.plot)
    result = bill.bill(seqs, head_dim=head_dim, dtype=args.dtype)
    if args.plot:
        bill.plot(result, args.plot)
    if args.json:
        print_json(result)
    else:
        from simulator.cli.common import output_console

        output_console().print(bill.render(result))
    return 0
