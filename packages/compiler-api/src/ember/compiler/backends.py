"""The backend registry: names -> ``(gm, example_inputs) -> callable`` compilers.

A backend follows the contract of custom ``torch.compile`` backends, so one
written for torch works with ember unchanged. Third-party packages register
backends under the entry-point group ``ember.backends``.

>>> "eager" in list_backends()
True
>>> @register_backend(name="double_check")
... def double_check(gm, example_inputs):
...     return gm.forward
>>> lookup_backend("double_check") is double_check
True
>>> unregister_backend("double_check")
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import torch

from ember.compiler.reporting import noting

Backend = Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]

ENTRY_POINT_GROUP = "ember.backends"

_BACKENDS: dict[str, Backend] = {}


@overload
def register_backend(fn: Backend, *, name: str | None = None) -> Backend: ...
@overload
def register_backend(
    fn: None = None, *, name: str | None = None
) -> Callable[[Backend], Backend]: ...


def register_backend(
    fn: Backend | None = None, *, name: str | None = None
) -> Backend | Callable[[Backend], Backend]:
    """Register ``fn`` as a backend under ``name`` (default: its ``__name__``).

    Use it as a decorator, with or without a name. A name is taken once. A backend
    with an ``options`` parameter receives ``compile(..., options=)``; if it also has
    a ``known_options`` attribute (a tuple of names), ``compile`` rejects other names.

    >>> def noop(gm, example_inputs):
    ...     return gm.forward
    >>> register_backend(noop) is noop
    True
    >>> unregister_backend("noop")
    """

    def register(f: Backend) -> Backend:
        key = name or f.__name__
        if key in _BACKENDS:
            raise ValueError(f"a backend named {key!r} is already registered")
        _BACKENDS[key] = f
        return f

    return register(fn) if fn is not None else register


def unregister_backend(name: str) -> None:
    """Remove a registered backend.

    >>> unregister_backend("no-such-backend")
    Traceback (most recent call last):
    KeyError: "no backend named 'no-such-backend'"
    """
    if name not in _BACKENDS:
        raise KeyError(f"no backend named {name!r}")
    del _BACKENDS[name]


def list_backends() -> list[str]:
    """The names of every registered backend (entry points included), sorted.

    >>> list_backends()[:4]
    ['aot_eager', 'cudagraphs', 'eager', 'inductor']
    """
    _load_entry_points()
    return sorted(_BACKENDS)


def lookup_backend(backend: str | Backend) -> Backend:
    """The backend callable for a name, or ``backend`` itself if it is callable.

    >>> lookup_backend("nonsense")
    Traceback (most recent call last):
    ValueError: unknown backend 'nonsense'; registered: aot_eager, cudagraphs, eager, inductor
    """
    if callable(backend):
        return backend
    if backend not in _BACKENDS:
        _load_entry_points()
    if backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; registered: {', '.join(sorted(_BACKENDS))}")
    return _BACKENDS[backend]


def backend_name(backend: str | Backend) -> str:
    """The name a backend's guard compares: the registered name, or the callable's qualname.

    >>> backend_name("eager")
    'eager'
    """
    if isinstance(backend, str):
        return backend
    for name, fn in _BACKENDS.items():
        if fn is backend:
            return name
    qualname = getattr(backend, "__qualname__", type(backend).__qualname__)
    return f"{getattr(backend, '__module__', '?')}.{qualname}#{id(backend):x}"


_loaded = False


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _BACKENDS:
            _BACKENDS[ep.name] = ep.load()


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """Run the captured graph as it is, with PyTorch's own kernels.

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> eager(gm, [torch.zeros(2)])(torch.zeros(2))
    tensor([1., 1.])
    """
    return gm.forward


@register_backend(name="aot_eager")
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """Trace forward and backward ahead of time with ``ember.aotgraph``; run the aten graphs as
    they are (no code generation, no decompositions beyond the ones aotgraph needs for
    semantics), so results are those of eager's own kernels. A check of the aotgraph layer.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x * x).sum())
    >>> x = torch.ones(3, requires_grad=True)
    >>> aot_eager(gm, [x])(x).backward()
    >>> x.grad
    tensor([2., 2., 2.])
    """
    from ember.aotgraph import aot_compile

    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=noting("forward", as_is),  # noted: the compile report shows the graphs
        bw_compiler=noting("backward", as_is),
        inference_compiler=noting("inference", as_is),
        decompositions={},
    )


@register_backend(name="cudagraphs")
def cudagraphs(
    gm: torch.fx.GraphModule,
    example_inputs: list[torch.Tensor],
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """aot_eager's aten graphs replayed from CUDA graphs (``ember.aotgraph.cudagraphs``):
    recorded once per shape after a warm-up call, the forward and backward graphs in one
    memory pool. Graphs of CPU tensors, or with ops a CUDA graph cannot hold, run as
    aot_eager's. ``options={"copy_outputs": True}`` returns copies of the outputs, which
    the next replay would overwrite.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x * x).sum())
    >>> cudagraphs(gm, [torch.ones(3)])(torch.ones(3))  # CPU: as aot_eager
    tensor(3.)
    """
    from ember.aotgraph import aot_compile
    from ember.aotgraph.cudagraphs import Pool, cudagraph_compiler

    options = options or {}
    pool, copy = Pool(), bool(options.get("copy_outputs", False))
    fw, bw, inference = (
        noting(role, cudagraph_compiler(as_is, pool, role, copy_outputs=copy))
        for role in ("forward", "backward", "inference")
    )
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=fw,
        bw_compiler=bw,
        inference_compiler=inference,
        decompositions={},
    )


def supports_dynamic(backend: Any) -> bool:
    """Whether ``backend`` takes graphs with symbolic sizes (``torch.SymInt`` in its fake
    tensors); a user's backend does unless it says ``supports_dynamic = False``.

    >>> supports_dynamic("eager"), supports_dynamic(lambda gm, inputs: gm)
    (True, True)
    """
    found = lookup_backend(backend) if isinstance(backend, str) else backend
    return bool(getattr(found, "supports_dynamic", True))


def automatic_dynamic(backend: Any) -> bool:
    """Whether ``dynamic=None`` makes a size symbolic for ``backend`` after it changed
    between compiles (automatic dynamic); a backend whose symbolic code is slower than its
    static code says ``automatic_dynamic = False`` and compiles per size instead, while
    ``dynamic=True`` and ``mark_dynamic`` still give it symbolic graphs.

    >>> def per_size(gm, inputs):
    ...     return gm
    >>> per_size.automatic_dynamic = False
    >>> automatic_dynamic("inductor"), automatic_dynamic(per_size)
    (True, False)
    """
    found = lookup_backend(backend) if isinstance(backend, str) else backend
    return bool(getattr(found, "automatic_dynamic", True))


def as_is(graph: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
    """aot_eager's inner compiler: the aten graph runs as it is (a module-level function, so
    that a repro script can import it).

    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> as_is(gm, []) is gm
    True
    """
    return graph


@register_backend(name="inductor")
def inductor(
    gm: torch.fx.GraphModule,
    example_inputs: list[torch.Tensor],
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """ember's code generator: ``ember.aotgraph`` traces forward and backward at the aten
    level, ``ember.inductor.compile_graph`` turns each into fused C++/OpenMP kernels
    (compiled once, cached on disk). ``options`` go to ``compile_graph``: ``cxx`` (the C++
    compiler), ``cflags`` (a list replacing the default flags), ``graph_cache`` (False:
    generate code again for graphs seen before), ``fallback_random`` (False: random ops
    such as dropout are computed inside the fused kernels, repeatable under
    ``torch.manual_seed`` but not eager's numbers), ``freezing`` (True: inference graphs
    read parameters and buffers as constants, see ``ember.inductor.freezing``); any other
    name is an error.

    >>> gm = torch.fx.symbolic_trace(lambda x: (x.sin() * 2).sum())
    >>> x = torch.ones(3, requires_grad=True)
    >>> inductor(gm, [x])(x).backward()
    >>> torch.allclose(x.grad, 2 * torch.cos(torch.ones(3)))
    True
    """
    from ember.aotgraph import aot_compile
    from ember.aotgraph.eager_checks import Unsupported
    from ember.inductor import compile_graph, decompositions, subclass_input
    from ember.inductor import settings as inductor_settings

    if (kind := subclass_input(example_inputs)) is not None:  # the training graphs see fakes
        raise Unsupported(
            f"an input is a {kind.__name__}, a torch.Tensor subclass whose type eager keeps "
            "in the outputs; generated kernels return plain tensors"
        )

    # a partial, not a closure: a repro script (EMBER_REPRO_AFTER=aot) can import it
    kernels: Any = functools.partial(compile_graph, options=options)
    # freezing holds for inference graphs only: a training graph's weights change each step
    training: Any = functools.partial(compile_graph, options={**(options or {}), "freezing": False})
    forward = backward = training
    if (found := inductor_settings.section.get()).cudagraphs:  # mode="reduce-overhead"
        from ember.aotgraph.cudagraphs import Pool, cudagraph_compiler

        pool, copy = Pool(), found.cudagraph_copy_outputs  # one pool: forward and backward
        kernels = cudagraph_compiler(kernels, pool, "inference", copy_outputs=copy)
        forward = cudagraph_compiler(training, pool, "forward", copy_outputs=copy)
        backward = cudagraph_compiler(training, pool, "backward", copy_outputs=copy)
    # Trace with the inductor's table (a superset of aotgraph's default), so compile_graph
    # gets graphs it need not re-trace. Passed as the function: aotgraph builds the table
    # only when it traces (not on a disk-cache hit), and keys its cache on the function.
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=noting("forward", forward),  # noted: the compile report shows the code
        bw_compiler=noting("backward", backward),
        inference_compiler=noting("inference", kernels),
        decompositions=decompositions,
    )


# inductor generates kernels whose sizes are arguments (issue 18): one build serves every
# size of a frame compiled with symbolic sizes, within about 10% of its static kernels' speed
# on most real models (benchmarks/run.py, ember:inductor+dynamic; docs/performance.md), so a
# size that changes between compiles goes symbolic, as on the other backends.
inductor.supports_dynamic = True  # type: ignore[attr-defined]
inductor.automatic_dynamic = True  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class OptionRule:
    """What one backend option accepts: ``check(value)`` returns ``""`` or what is wrong.

    >>> INDUCTOR_OPTIONS["graph_cache"].check("yes")
    'must be a bool, not str'
    """

    check: Callable[[Any], str]
    meaning: str


def _is(*types: type) -> Callable[[Any], str]:
    names = " or ".join(t.__name__ for t in types)
    return lambda v: "" if isinstance(v, types) else f"must be a {names}, not {type(v).__name__}"


def _compiler(value: Any) -> str:
    if not isinstance(value, str) or not value:
        return f"must be the name or path of a C++ compiler, not {value!r}"
    found = (
        shutil.which(value)
        if os.sep not in value
        else (value if os.access(value, os.X_OK) else None)
    )
    return "" if found else f"{value!r} is not an executable C++ compiler (not found)"


def _flags(value: Any) -> str:
    if isinstance(value, list | tuple) and all(isinstance(f, str) for f in value):
        return ""
    return f"must be a list of strings (one flag each), not {value!r}"


# inductor's options, checked by compile() so a bad one fails there, not at the first call.
INDUCTOR_OPTIONS: dict[str, OptionRule] = {
    "cxx": OptionRule(_compiler, "the C++ compiler"),
    "cflags": OptionRule(_flags, "flags replacing the default ones"),
    "graph_cache": OptionRule(_is(bool), "False: generate code again for graphs seen before"),
    "fallback_random": OptionRule(_is(bool), "False: random ops inside the fused kernels"),
    "freezing": OptionRule(_is(bool), "True: inference graphs fold parameters as constants"),
}

inductor.known_options = tuple(INDUCTOR_OPTIONS)  # type: ignore[attr-defined]
inductor.option_rules = INDUCTOR_OPTIONS  # type: ignore[attr-defined]
CUDAGRAPHS_OPTIONS = {
    "copy_outputs": OptionRule(_is(bool), "True: copies of the outputs, not the graph's memory")
}
cudagraphs.known_options = tuple(CUDAGRAPHS_OPTIONS)  # type: ignore[attr-defined]
cudagraphs.option_rules = CUDAGRAPHS_OPTIONS  # type: ignore[attr-defined]
