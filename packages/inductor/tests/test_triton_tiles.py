"""2-D tiles (``triton_tiles.py``) for pointwise Triton kernels whose loads and stores run
along different dims, under Triton's interpreter against eager: a transposed operand, a
transpose copy, a permutation of three dims, ragged tiles, half precision; kernels whose
reads all follow the store stay flat.

Triton must be imported with ``TRITON_INTERPRET=1`` set (see ``test_triton.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

T = torch.Tensor
OPTIONS = {"cpu_backend": "triton", "graph_cache": False}
TILED = re.compile(r"tl\.arange\(0, \d+\)\[None, :\]\n.*tl\.arange\(0, \d+\)\[:, None\]")


def _compiled(fn: Callable[..., Any], *inputs: T) -> Any:
    compiled = compile_graph(make_fx(fn)(*inputs), list(inputs), OPTIONS)
    assert compiled.target is not None and compiled.target.printer == "triton"
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), equal_nan=True)
    return compiled


CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "add-transposed": (lambda x, y: x + y.t(), [(37, 129), (129, 37)]),
    "transpose-copy": (lambda x: x.t().contiguous() * 2, [(70, 45)]),
    "permute-3d": (lambda x: x.permute(0, 2, 1).contiguous(), [(3, 33, 65)]),
    "permute-outer": (lambda x: x.permute(2, 1, 0).contiguous().exp(), [(5, 6, 40)]),
    "one-column-tile": (lambda x, y: x + y.t(), [(1000, 3), (3, 1000)]),
    "broadcast-and-transposed": (
        lambda x, y, b: (x * y.t() + b).relu(),
        [(40, 50), (50, 40), (50,)],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_mixed_layouts_get_2d_tiles(name: str) -> None:
    fn, shapes = CASES[name]
    compiled = _compiled(fn, *(torch.randn(s) for s in shapes))
    assert TILED.search(compiled.source), compiled.source


def test_ragged_tiles_mask_both_directions() -> None:
    """33 x 65: the last tile in each direction is mostly masked; a store past either
    edge would write outside the output (caught by the values beside it)."""
    x = torch.randn(65, 33)
    compiled = _compiled(lambda x: (x.t() + 1, x.t().contiguous()), x)
    assert "< 33)" in compiled.source and "< 65)" in compiled.source


def test_half_precision_tiles() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        x, y = torch.randn(48, 40).to(dtype), torch.randn(40, 48).to(dtype)
        compiled = _compiled(lambda x, y: (x + y.t()).sigmoid(), x, y)
        assert TILED.search(compiled.source)


def test_reads_along_the_store_stay_flat() -> None:
    x, b, c = torch.randn(37, 129), torch.randn(129), torch.randn(37, 1)
    compiled = _compiled(lambda x, b, c: (x + b) * c, x, b, c)  # broadcasts: no transposed read
    assert not TILED.search(compiled.source) and "index = " in compiled.source
    compiled = _compiled(lambda x: x.t() * 2, x)  # the output keeps the input's layout
    assert not TILED.search(compiled.source)


def test_max_autotune_block_sizes_keep_tiles_right() -> None:
    from ember.inductor.autotune import triton_candidates
    from ember.inductor.knobs import knobs

    x, y = torch.randn(37, 70), torch.randn(70, 37)
    for chosen in triton_candidates():
        with knobs(chosen):
            _compiled(lambda x, y: x - y.t(), x, y)
