"""ember.aotgraph: joint forward/backward graphs ahead of time, partitioned and compiled.

:func:`aot_compile` turns a ``torch.fx`` graph into a functional aten-level
forward graph and backward graph (traced together with autograd, functionalized,
decomposed with :func:`default_decompositions`), split by a partitioner
(:func:`min_cut_partition` or :func:`default_partition`), compiled by the
caller's compilers and run by an ``autograd.Function``. It needs only torch and
networkx: a backend author uses it without the rest of ember.

>>> import torch
>>> from ember.aotgraph import aot_compile
>>> graphs = {}
>>> def keep(name):
...     def compiler(gm, example_inputs):
...         graphs[name] = gm
...         return gm  # run the aten graph as it is
...     return compiler
>>> def f(x, w):
...     return (x @ w).relu().sum()
>>> x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
>>> g = aot_compile(torch.fx.symbolic_trace(f), [x, w],
...                 fw_compiler=keep("forward"), bw_compiler=keep("backward"))
>>> g(x, w).backward()
>>> torch.testing.assert_close(w.grad, torch.autograd.grad(f(x, w), w)[0])
>>> print(graphs["forward"].code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, primals_1, primals_2):
    mm = torch.ops.aten.mm.default(primals_1, primals_2);  primals_2 = None
    relu = torch.ops.aten.relu.default(mm);  mm = None
    sum_1 = torch.ops.aten.sum.default(relu)
    le = torch.ops.aten.le.Scalar(relu, 0);  relu = None
    return [sum_1, primals_1, le]
>>> print(graphs["backward"].code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, primals_1, le, tangents_1):
    expand = torch.ops.aten.expand.default(tangents_1, [4, 5]);  tangents_1 = None
    scalar_tensor = torch.ops.aten.scalar_tensor.default(0, dtype = torch.float32, ...)
    where = torch.ops.aten.where.self(le, scalar_tensor, expand);  le = ...
    t = torch.ops.aten.t.default(primals_1);  primals_1 = None
    mm_1 = torch.ops.aten.mm.default(t, where);  t = where = None
    return [mm_1]
>>> g.partition.summary()  # min-cut saves the 1-byte mask of relu, not its output
'saves 2 tensors, 68 bytes (20 bytes of activations)'

Under ``torch.no_grad()`` (or when no input requires grad) the same callable
runs a forward-only graph from ``inference_compiler``, built on first use.

:func:`lower_exported` lowers a program ``ember.capture.export`` made (its graph module
and its signature as plain data, :class:`ProgramSignature`) to functional aten ops, as
torch's ``run_decompositions`` does: an inference graph, or the joint forward+backward.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.aotgraph.api import PARTITIONERS, AOTCompiled, Compiler, aot_compile
    from ember.aotgraph.check import CheckError
    from ember.aotgraph.decompositions import default_decompositions
    from ember.aotgraph.exported import AtenProgram, lower_exported
    from ember.aotgraph.exported_checks import LoweredModule, LoweringError
    from ember.aotgraph.mincut import min_cut_partition
    from ember.aotgraph.partition import Partition, default_partition, partition_from_saved
    from ember.aotgraph.program_signature import IOSpec, ProgramSignature
    from ember.aotgraph.trace import JointGraph

__version__ = "0.1.0"
__all__ = [
    "PARTITIONERS",
    "AOTCompiled",
    "AtenProgram",
    "CheckError",
    "Compiler",
    "IOSpec",
    "JointGraph",
    "LoweredModule",
    "LoweringError",
    "Partition",
    "ProgramSignature",
    "aot_compile",
    "default_decompositions",
    "default_partition",
    "lower_exported",
    "min_cut_partition",
    "partition_from_saved",
]

# Imported on first use: ``import ember.aotgraph.settings`` (ember.compiler's config) or
# ``store`` does not pay for the tracer and the partitioners.
_LAZY = {
    "PARTITIONERS": "ember.aotgraph.api",
    "AOTCompiled": "ember.aotgraph.api",
    "Compiler": "ember.aotgraph.api",
    "aot_compile": "ember.aotgraph.api",
    "CheckError": "ember.aotgraph.check",
    "default_decompositions": "ember.aotgraph.decompositions",
    "AtenProgram": "ember.aotgraph.exported",
    "lower_exported": "ember.aotgraph.exported",
    "LoweredModule": "ember.aotgraph.exported_checks",
    "LoweringError": "ember.aotgraph.exported_checks",
    "min_cut_partition": "ember.aotgraph.mincut",
    "Partition": "ember.aotgraph.partition",
    "default_partition": "ember.aotgraph.partition",
    "partition_from_saved": "ember.aotgraph.partition",
    "IOSpec": "ember.aotgraph.program_signature",
    "ProgramSignature": "ember.aotgraph.program_signature",
    "JointGraph": "ember.aotgraph.trace",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.aotgraph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
