"""``aten.pow.Scalar`` (a number to a tensor's power) in kernels: eager's values and dtypes,
and aten's kernel where the power is an integer one."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph
from ember.inductor.ir import Extern

EXPONENTS = {
    "float32": torch.linspace(-20, 200, 301),
    "float64": torch.linspace(-20, 200, 301, dtype=torch.float64),
    "int64": torch.arange(-5, 300),
    "bool": torch.tensor([True, False, True]),
}


@pytest.mark.parametrize("base", [0.9, 0.999, 2.5, 2], ids=str)
@pytest.mark.parametrize("dtype", list(EXPONENTS))
def test_a_number_to_a_tensor_power_matches_eager(dtype: str, base: float) -> None:
    s = EXPONENTS[dtype]
    gm = make_fx(lambda s: (torch.pow(base, s),))(s)
    compiled = compile_graph(gm, [s], {"graph_cache": False})
    (got,), (want,) = compiled(s), (torch.pow(base, s),)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0, equal_nan=True)
    externs = [x for x in compiled.schedule.steps if isinstance(x, Extern)]
    integer = isinstance(base, int) and not s.dtype.is_floating_point
    assert bool(externs) == integer  # an integer power stays aten's (exact) kernel
