"""Tile sizes and pipelining parameters of a kernel (what a Triton config chooses)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from traces.problem import ProblemError

MIN_BLOCK = 16
MAX_BLOCK = 256


def _is_int(x: object) -> bool:
    """An integer, not a bool or a float (``True == 1`` and ``4.0 == 4`` pass ``in`` tests)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class Tiling:
    """Block sizes and pipeline depth.

    ``block_m`` rows of Q (or of the output) per CTA tile, ``block_n`` rows of K/V per
    inner-loop step, ``num_stages`` shared-memory buffers of software pipelining (Triton
    keeps ``num_stages - 1`` iterations' loads in flight and issues the next after the
    matmuls: ``kernels.resources.loop_pipeline``),
    ``num_warps`` warps per CTA, ``split_kv`` K/V chunks for split-KV decoding.
    """

    block_m: int = 128
    block_n: int = 64
    num_stages: int = 2
    num_warps: int = 4
    split_kv: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not _is_int(value) or not _is_power_of_two(value) or value < MIN_BLOCK:
                raise ProblemError(
                    f'"{name}" must be a power of two >= {MIN_BLOCK}, got {value!r}.'
                )
            if value > MAX_BLOCK:
                raise ProblemError(f'"{name}" must be <= {MAX_BLOCK}, got {value}.')
        if not _is_int(self.num_stages) or not 1 <= self.num_stages <= 8:
            raise ProblemError(f'"num_stages" must be in 1..8, got {self.num_stages!r}.')
        if not _is_int(self.num_warps) or self.num_warps not in (1, 2, 4, 8, 16):
            raise ProblemError(
                f'"num_warps" must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}.'
            )
        if not _is_int(self.split_kv) or self.split_kv < 1:
            raise ProblemError(f'"split_kv" must be a positive integer, got {self.split_kv!r}.')

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Tiling:
        return cls(**d)

    def describe(self) -> str:
        s = f"BM={self.block_m} BN={self.block_n} stages={self.num_stages} warps={self.num_warps}"
        return s + (f" split={self.split_kv}" if self.split_kv > 1 else "")
