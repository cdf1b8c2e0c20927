"""Nearest-neighbour upsampling (``lower_resize.py``) against eager: every output point
picks eager's source (aten rounds its index in float32), lowered where exact index
arithmetic agrees at every point, the aten call where it does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.ir import I
from ember.inductor.lower_resize import _source
from ember.inductor.scheduler import Extern


def _compiled(f, *inputs):
    return compile_graph(make_fx(f)(*inputs), list(inputs))


CASES = [  # (input shape, interpolate keyword arguments)
    ((2, 3, 5, 7), {"scale_factor": 2.0}),
    ((2, 3, 6, 4), {"size": (12, 8)}),
    ((1, 2, 4, 6), {"scale_factor": 3}),
    ((1, 2, 9, 9), {"size": (3, 3)}),  # down by a whole factor
    ((1, 2, 7, 5), {"size": (16, 11)}),  # ratios aten's float index may round
    ((2, 3, 10), {"scale_factor": 2.0}),
    ((1, 2, 3, 4, 5), {"scale_factor": 2}),
    ((1, 1, 5, 5), {"scale_factor": 1.7}),
]


@pytest.mark.parametrize(("shape", "kwargs"), CASES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_upsample_nearest_gives_eagers_values(shape, kwargs, layout):
    x = torch.randn(shape)
    if layout == "channels_last":  # channels innermost, as a UNet's attention leaves them
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)

    def f(x):
        return F.interpolate(x * 2, mode="nearest", **kwargs) + 1

    compiled = _compiled(f, x)
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)


def test_the_unets_2x_upsampler_is_a_kernel_not_a_gather():
    x = torch.randn(2, 8, 16, 16)
    compiled = _compiled(lambda x: F.interpolate(x, scale_factor=2.0) * 3, x)
    externs = [s for s in compiled.schedule.steps if isinstance(s, Extern)]
    assert not externs, externs  # torch's decomposition gathers with a computed index
    torch.testing.assert_close(compiled(x), F.interpolate(x, scale_factor=2.0) * 3)


def test_source_index_matches_aten_or_declines():
    """Against aten's own result on a ramp, for many size pairs: an exact formula is only
    returned when every point agrees."""
    for n_in in range(1, 13):
        for n_out in range(1, 30):
            x = torch.arange(n_in, dtype=torch.float32).view(1, 1, n_in)
            want = F.interpolate(x, size=n_out, mode="nearest").view(-1).long().numpy()
            src = _source(n_in, n_out, None)
            if src is not None:
                got = [int(src.subs(I[0], o)) for o in range(n_out)]
                assert np.array_equal(got, want), (n_in, n_out)
