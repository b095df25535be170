"""The attention problem: shapes, dtype, masking and which pass runs.

An ``AttentionProblem`` is pure data. It validates itself on construction so that every
later stage (schedules, counting, simulation, kernels) can trust its fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Bytes per element of each supported input dtype.
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}
PASSES = ("fwd", "bwd", "fwd+bwd")
STATS_BYTES = 4  # LSE, D, l and m are always fp32
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 256


class ProblemError(ValueError):
    """A problem, tiling or hardware description a user gave is not valid."""


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call: ``softmax(scale * Q K^T [+ mask]) V``.

    Q is ``[batch, heads, seq_q, head_dim]``; K and V are ``[batch, kv_heads, seq_kv,
    head_dim]``. ``kv_heads`` < ``heads`` is grouped-query attention (``kv_heads == 1`` is
    multi-query). Causal masking is aligned to the bottom-right corner when
    ``seq_q != seq_kv`` (query row i sees keys ``j <= i + seq_kv - seq_q``), as
    FlashAttention does.
    """

    batch: int
    heads: int
    seq_q: int
    head_dim: int
    seq_kv: int | None = None
    kv_heads: int | None = None
    dtype: str = "bf16"
    causal: bool = False
    pass_: str = "fwd"

    def __post_init__(self) -> None:
        if self.seq_kv is None:
            object.__setattr__(self, "seq_kv", self.seq_q)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ProblemError(f'"{name}" must be a positive integer, got {value!r}.')
        if not MIN_HEAD_DIM <= self.head_dim <= MAX_HEAD_DIM:
            raise ProblemError(
                f'"head_dim" must be in {MIN_HEAD_DIM}..{MAX_HEAD_DIM}, got {self.head_dim}.'
            )
        if self.heads % self.kv_heads:
            raise ProblemError(
                f'"kv_heads" ({self.kv_heads}) must divide "heads" ({self.heads}).'
            )
        if self.dtype not in DTYPE_BYTES:
            raise ProblemError(
                f'"dtype" must be one of {", ".join(DTYPE_BYTES)}, got {self.dtype!r}.'
            )
        if self.pass_ not in PASSES:
            raise ProblemError(f'"pass" must be one of {", ".join(PASSES)}, got {self.pass_!r}.')

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group_size(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        """Query row i may attend to key columns ``j <= i + causal_offset``."""
        return self.seq_kv - self.seq_q

    def convention_flops(self) -> int:
        """FLOPs by the FlashAttention papers' convention (used for TFLOP/s figures).

        Forward 4·B·H·d times the query-key pairs: ``Nq·Nkv``, and for causal masking the
        area of the unmasked region, which halves it when ``Nq == Nkv`` as the papers do.
        With the bottom-right alignment (``causal_offset``) and ``Nq < Nkv`` every row sees
        ``Nkv - Nq`` keys more than the square triangle: ``Nq·Nkv - Nq²/2`` (decode's one
        query sees all its keys); with ``Nq > Nkv`` the first ``Nq - Nkv`` rows see none:
        ``Nkv²/2``. Halving ``Nq·Nkv`` there would rate a 16k x 4k causal kernel at twice
        the chip's peak. Backward is 2.5x forward.
        """
        b, h, nq, nkv, d = self.batch, self.heads, self.seq_q, self.seq_kv, self.head_dim
        if not self.causal:
            fwd = 4 * b * h * nq * nkv * d
        elif nq <= nkv:
            fwd = 2 * b * h * (2 * nq * nkv - nq * nq) * d
        else:
            fwd = 2 * b * h * nkv * nkv * d
        return {"fwd": fwd, "bwd": fwd * 5 // 2, "fwd+bwd": fwd * 7 // 2}[self.pass_]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> AttentionProblem:
        d = dict(d)
        if "pass" in d:
            d["pass_"] = d.pop("pass")
        return cls(**d)

    def describe(self) -> str:
        kv = f"/{self.kv_heads}kv" if self.kv_heads != self.heads else ""
        n = f"{self.seq_q}" if self.seq_q == self.seq_kv else f"{self.seq_q}x{self.seq_kv}"
        mask = " causal" if self.causal else ""
        return (
            f"B={self.batch} H={self.heads}{kv} N={n} d={self.head_dim} "
            f"{self.dtype}{mask} {self.pass_}"
        )
