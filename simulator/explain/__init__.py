"""Explainers: small, exact demonstrations of why tiled attention wins.

One module per explainer. Each offers the same three layers so that the CLI and a report
can share them:

- a pure function returning a plain ``dict`` of numbers (what ``--json`` prints),
- ``render(result)``: a ``rich`` renderable (table plus notes) for the terminal,
- ``plot(result, path)``: a matplotlib figure written to ``.png`` or ``.svg``.

``bill``   the N x N score-matrix traffic bill of naive attention against its FLOPs.
``ledger`` the online-softmax ledger of one score row, and the streamer that skips the rescale.
``race``   a real CPU race: naive attention holding N x N against a tiled numba kernel.
"""
