"""ember.inductor: fused C++/OpenMP kernels for aten-level graphs.

:func:`compile_graph` takes an aten-level ``torch.fx`` graph (as ``make_fx`` or
``ember.aotgraph`` produce) and example inputs, and returns a callable that
computes the same outputs with generated kernels. On the way the graph is
lowered to a backend-neutral loop IR (:mod:`ember.inductor.ir`), simplified,
fused into kernels (:mod:`ember.inductor.scheduler`), printed as one C++
translation unit (:mod:`ember.inductor.codegen_cpp`), compiled with the system
compiler and cached on disk (:mod:`ember.inductor.cache`). Matrix multiplies,
convolutions and every op without a lowering run as aten calls.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from ember.inductor import compile_graph
>>> def f(x, w):
...     return torch.nn.functional.gelu(x @ w).sum(-1)
>>> x, w = torch.randn(16, 32), torch.randn(32, 8)
>>> compiled = compile_graph(make_fx(f)(x, w), [x, w])
>>> torch.testing.assert_close(compiled(x, w), f(x, w))
>>> for step in compiled.schedule.steps:  # mm runs in aten; gelu and sum are one kernel
...     print(str(step).splitlines()[0])
buf0 = extern aten.mm.default(x_1, w_1)
kernel0 over [16]

Set ``EMBER_INDUCTOR_TRACE=1`` to keep each graph's stages in a folder, and
``EMBER_CACHE_DIR`` to move the kernel cache (see docs/inductor.md).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.inductor.cache import CompileError, CompileOptions, cache_dir
    from ember.inductor.compile import compile_graph, decompositions, subclass_input
    from ember.inductor.compiled import CompiledGraph
    from ember.inductor.lowering import LOWERINGS, lower_graph

__version__ = "0.1.0"
__all__ = [
    "LOWERINGS",
    "CompileError",
    "CompileOptions",
    "CompiledGraph",
    "cache_dir",
    "compile_graph",
    "decompositions",
    "lower_graph",
    "subclass_input",
]

# Imported on first use: ``import ember.inductor.settings`` (ember.compiler's config) and a
# loaded pack's kernels do not pay for sympy and the lowerings.
_LAZY = {
    "CompileError": "ember.inductor.cache",
    "CompileOptions": "ember.inductor.cache",
    "cache_dir": "ember.inductor.cache",
    "CompiledGraph": "ember.inductor.compiled",
    "compile_graph": "ember.inductor.compile",
    "decompositions": "ember.inductor.compile",
    "subclass_input": "ember.inductor.compile",
    "LOWERINGS": "ember.inductor.lowering",
    "lower_graph": "ember.inductor.lowering",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.inductor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
