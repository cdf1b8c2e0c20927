"""The code-generation choices that ``max_autotune`` times per graph (ember.inductor.autotune).

A :class:`Knobs` value is read where each choice is made: ``addmm`` by the lowering of
``aten.addmm``, ``block``, ``row_elements`` and ``warps`` by the Triton printer, the
others by the C++ code generator. :func:`knobs` sets one for a block,
so the passes keep their signatures and the defaults cost nothing.

>>> with knobs(Knobs(tile=8)):
...     KNOBS.get().tile
8
>>> Knobs(threads=2).lowering == Knobs().lowering  # a thread count needs no new lowering
True
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ADDMM_PATHS", "KNOBS", "MATMUL_PATHS", "PARALLEL_MIN_WORK", "Knobs", "knobs"]

PARALLEL_MIN_WORK = 1 << 17  # elements below which a kernel stays on one thread (a parallel
# region costs a wake-up, and on a busy machine a wait for a descheduled thread)

#: How ``bias + a @ b`` runs: ``fused``, ``torch.mm`` and the add fused into the result's
#: consumers (one pass over the output fewer); ``aten``, aten's addmm whole (its BLAS call
#: accumulates onto the bias, which wins when the product is small and the bias add costs
#: a kernel of its own).
ADDMM_PATHS = ("fused", "aten")

#: How ``a @ b`` (``mm``, and ``addmm``'s product) runs: ``aten``, the extern call (cuBLAS,
#: or the CPU's BLAS); ``template``, a sum over the shared dim in the loop IR, which the
#: Triton printer writes as a tiled ``tl.dot`` kernel with its consumers' pointwise work
#: fused after it (max_autotune times it against the extern on a GPU).
MATMUL_PATHS = ("aten", "template")


@dataclass(frozen=True, slots=True)
class Knobs:
    """One choice of each code-generation knob; ``Knobs()`` is the default code."""

    tile: int = 16  # outputs a column kernel computes together (two AVX2 vectors of float)
    parallel_min_work: int = PARALLEL_MIN_WORK  # less work than this stays on one thread
    threads: int = 0  # OpenMP threads of a parallel loop; 0: OpenMP's default (all)
    addmm: str = "fused"  # one of ADDMM_PATHS
    matmul: str = "aten"  # one of MATMUL_PATHS
    # Triton: points a program of a flat kernel takes; the most elements (XBLOCK * RBLOCK)
    # of a row kernel's block; warps per program (0: by the block's size)
    block: int = 1024
    row_elements: int = 4096
    warps: int = 0

    def __post_init__(self) -> None:
        if self.addmm not in ADDMM_PATHS:
            raise ValueError(f"addmm path {self.addmm!r}; the paths are {ADDMM_PATHS}")
        if self.matmul not in MATMUL_PATHS:
            raise ValueError(f"matmul path {self.matmul!r}; the paths are {MATMUL_PATHS}")
        if self.threads < 0 or self.tile < 1 or self.warps < 0:
            raise ValueError(f"bad knobs {self}: threads >= 0, tile >= 1, warps >= 0")
        for n in (self.block, self.row_elements):
            if n < 1 or n & (n - 1):
                raise ValueError(f"bad knobs {self}: Triton blocks are powers of two")

    @property
    def lowering(self) -> tuple[str, str]:
        """The part of the choice that lowering reads: knobs that differ only elsewhere
        share one lowered program and schedule."""
        return (self.addmm, self.matmul)

    @property
    def num_threads(self) -> str:
        """The OpenMP clause of a parallel loop under this choice (empty: the default)."""
        return f" num_threads({self.threads})" if self.threads else ""


_DEFAULT = Knobs()
KNOBS: contextvars.ContextVar[Knobs] = contextvars.ContextVar("ember.knobs", default=_DEFAULT)


@contextlib.contextmanager
def knobs(chosen: Knobs) -> Iterator[None]:
    """Lower and generate code with ``chosen`` for the block."""
    token = KNOBS.set(chosen)
    try:
        yield
    finally:
        KNOBS.reset(token)
