"""``compile_graph``: the pipeline from an aten-level fx graph to a compiled callable.

The pipeline is a flat list of named passes (:data:`PASSES`); with
``EMBER_CHECK=1`` the IR checker runs after each loop-IR pass, and with
``EMBER_INDUCTOR_TRACE=1`` each graph leaves a folder with every stage's
output (see docs/inductor.md).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._subclasses.fake_impls import _compute_stride
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils import _pytree as pytree

from ember.aotgraph import hints
from ember.aotgraph.compiler_hook import CALLED_BOXED
from ember.aotgraph.symbolic_views import contiguous_for_every_size
from ember.inductor import (
    autotune,
    background,
    cache,
    decomp_norm,
    fills,
    freezing,
    graph_cache,
    layout_conv,
    log,
    settings,
    timing,
    triton_cache,
    wrapper_triton,
)
from ember.inductor.check import enabled
from ember.inductor.codegen_cpp import translation_unit
from ember.inductor.codegen_triton import Unsupported
from ember.inductor.compiled import CompiledGraph, _Run, from_record
from ember.inductor.eager_kernels import unless_lacking
from ember.inductor.knobs import Knobs, knobs
from ember.inductor.lowering import Fallback, lower_graph
from ember.inductor.rewrite import simplify
from ember.inductor.scheduler import Kernel, Schedule, eliminate_dead, schedule

__all__ = ["CompiledGraph", "compile_graph", "decompositions", "subclass_input"]

aten = torch.ops.aten

# Random ops keep torch's own kernels, so they draw the same numbers as eager.
RANDOM = ("rand", "bernoulli", "normal", "uniform", "exponential", "multinomial", "poisson")

# Ops the lowering handles itself, or that must keep torch's kernel (extern calls).
KEEP = {
    aten.gelu.default,  # lower_alone.py: eager's kernel where it stands alone, else fused
    aten.addmm.default,
    aten.mm.default,
    aten.bmm.default,
    aten.convolution.default,
    aten.convolution_backward.default,
    aten.native_dropout.default,
    aten.embedding.default,
    aten.index_select.default,
    aten._unsafe_view.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten.clone.default,
    *(getattr(aten, f"upsample_nearest{k}d").vec for k in (1, 2, 3)),  # lower_resize.py
    *(getattr(aten, f"upsample_nearest{k}d").default for k in (1, 2, 3)),
}

# Composites decomposed beyond torch's core table.
EXTRA = (
    aten.native_layer_norm,
    aten.native_layer_norm_backward,
    aten._softmax,
    aten._log_softmax,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.gelu,
    aten.gelu_backward,
    aten.var_mean,
    aten.var,
    aten.std,
    aten.silu,
    aten.silu_backward,
    aten.tanh_backward,
    aten.sigmoid_backward,
    aten.threshold_backward,
    aten.embedding_dense_backward,
    aten.native_batch_norm_backward,
    aten.mse_loss,
    aten.hardtanh,
    aten.addcmul,
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,  # eval mode, as a symbolic trace reaches it
    aten.native_batch_norm,
    aten.mean,
    aten.t,
    aten.transpose.int,
    aten.detach,
)


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """The table that rewrites composite ops into ops with lowerings (built on first use).

    ``ember.aotgraph`` traces with it when the ``inductor`` backend compiles, so the
    graphs reach :func:`compile_graph` decomposed and :func:`decompose` has nothing
    to do; a graph from elsewhere is re-traced with it once.

    >>> table = decompositions()
    >>> aten.silu.default in table, aten.mm.default in table  # mm stays an extern call
    (True, False)
    """
    table = {
        k: v
        for k, v in core_aten_decompositions().items()  # type: ignore[no-untyped-call]
        if not any(w in str(k) for w in RANDOM)
    }
    table.update(get_decompositions(list(EXTRA)))
    for op in KEEP:
        table.pop(op, None)
    table[aten.native_layer_norm.default] = decomp_norm.native_layer_norm
    table = {op: unless_lacking(op, fn) for op, fn in table.items()}  # eager's errors stay
    table[aten.view.default] = _view_as_reshape
    table.update(PRIM_VIEWS)
    return table


def _view_as_reshape(a: torch.Tensor, size: Sequence[int]) -> Any:
    """Decompositions need not give eager's strides, so a later view may need a copy.

    A view that ``a``'s strides allow stays a view (``NotImplemented`` tells ``make_fx`` to
    record the op itself): it aliases ``a``, so an in-place op through it reaches ``a``
    when ``ember.aotgraph`` functionalizes the graph. Only a view that the decomposed
    strides forbid (where eager's strides allowed it) becomes a copy."""
    if _keeps_view(a, size):
        return NotImplemented
    a = aten.clone.default(a, memory_format=torch.contiguous_format)
    out: torch.Tensor = aten._unsafe_view.default(a, size)
    return out


def _keeps_view(a: torch.Tensor, size: Sequence[int]) -> bool:
    """Whether ``a``'s strides allow the view to ``size``, remembered per layout: a view of
    one shape recurs in every layer, and with symbolic sizes each answer costs 3 ms of
    SymInt arithmetic (gpt-infer under dynamic=True: 61 views, 10 distinct). Symbolic
    answers are kept in their ShapeEnv (its symbols' names mean nothing in another), and
    the guards the first answer added are there already."""
    parts: tuple[tuple[Any, ...], ...] = (tuple(a.shape), a.stride(), tuple(size))
    key = tuple(tuple(n.node.expr if isinstance(n, torch.SymInt) else n for n in p) for p in parts)
    syms = [n for p in parts for n in p if isinstance(n, torch.SymInt)]
    if syms and (key[2] == key[0] or contiguous_for_every_size(key[0], key[1])):
        return True  # its own shape, or any view of a contiguous layout (the op checks counts)
    env = syms[0].node.shape_env if syms else None
    memo: dict[Any, bool] = _STATIC_VIEWS if env is None else env.__dict__.setdefault(_MEMO, {})
    found = memo.get(key)
    if found is None:
        shape = torch._prims_common.infer_size(list(size), a.numel())
        found = memo[key] = _compute_stride(a.shape, a.stride(), shape) is not None
        if len(_STATIC_VIEWS) > 4096:
            _STATIC_VIEWS.clear()
    return found


_STATIC_VIEWS: dict[Any, bool] = {}
_MEMO = "_ember_inductor_views"  # the attribute of a ShapeEnv holding its answers


prims = torch.ops.prims


def _broadcast_in_dim(a: torch.Tensor, shape: Sequence[int], dims: Sequence[int]) -> torch.Tensor:
    for d in range(len(shape)):
        if d not in dims:
            a = aten.unsqueeze.default(a, d)
    out: torch.Tensor = aten.expand.default(a, list(shape))
    return out


def _collapse_view(a: torch.Tensor, start: int, end: int) -> torch.Tensor:
    size = list(a.shape)  # dims start..end, both included, become one
    inner = functools.reduce(operator.mul, size[start : end + 1], 1)
    out: torch.Tensor = aten.view.default(a, [*size[:start], inner, *size[end + 1 :]])
    return out


def _split_dim(a: torch.Tensor, dim: int, outer: int) -> torch.Tensor:
    size = list(a.shape)
    out: torch.Tensor = aten.view.default(
        a, [*size[:dim], outer, size[dim] // outer, *size[dim + 1 :]]
    )
    return out


# torch's reference decompositions (mean, var, layer norm, ...) return views made by prims
# with alias annotations, which functionalization (in ember.aotgraph) rejects: as aten views.
PRIM_VIEWS: dict[Any, Callable[..., Any]] = {
    prims.broadcast_in_dim.default: _broadcast_in_dim,
    prims.collapse_view.default: _collapse_view,
    prims.split_dim.default: _split_dim,
    prims.squeeze.default: lambda a, dims: aten.squeeze.dims(a, list(dims)),
    prims.transpose.default: lambda a, perm: aten.permute.default(a, list(perm)),
    prims.view_of.default: lambda a: aten.view.default(a, list(a.shape)),
}


# Table entries that leave the op as it is when they can (returning NotImplemented).
KEPT_VIEWS = frozenset({aten.view.default})


def decompose(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """Re-trace ``gm`` with :func:`decompositions` if it has composite ops or lacks fake values."""
    table = decompositions()
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if all("val" in n.meta and (n.target not in table or n.target in KEPT_VIEWS) for n in calls):
        return gm
    if graph_cache.symbolic(gm):  # a re-trace would specialise the sizes: composites stay aten
        if all("val" in n.meta for n in calls):
            return gm
        raise Fallback("a graph with symbolic sizes and nodes without fake values")
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        # make_fx would bake the example numbers into the graph as constants
        raise Fallback("a graph with number inputs needs decompositions")
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # get_attr tensors stay real
    fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    with mode:
        out = make_fx(gm, decomposition_table=table, tracing_mode="real")(*fakes)
    if _output_metas(out) != _output_metas(gm) and all("val" in n.meta for n in calls):
        return gm  # a decomposition disagrees with the kernel it replaces: keep the kernel
    return out


def _output_metas(gm: torch.fx.GraphModule) -> list[Any]:
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return [
        (tuple(v.shape), v.dtype)
        if isinstance(v := getattr(a, "meta", {}).get("val"), torch.Tensor)
        else type(v)
        for a in pytree.tree_leaves(out.args[0])
    ]


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """Compile an aten-level graph into fused C++/OpenMP or Triton kernels; return a callable.

    The callable takes the graph's inputs and returns what ``gm`` returns.
    Ops without a lowering run as aten calls; a graph that cannot be lowered
    at all runs as ``gm`` itself, so this never fails for want of an op.
    CUDA inputs get Triton kernels, CPU inputs C++ (or Triton's interpreter under
    ``cpu_backend="triton"``; see docs/inductor.md, "Triton").
    ``options`` override the settings of the same names (``cxx``, ``cflags``,
    ``graph_cache``, ``fallback_random``, ``max_autotune``, ``freezing``, ``cpu_backend``,
    ``conv_channels_last``)
    for this graph; their meanings are in :class:`~ember.inductor.settings.InductorSettings`. Under
    ``freezing`` the graph must be an inference graph (no gradient is taken through it).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     return torch.softmax(x, -1) * 2
    >>> x = torch.randn(8, 16)
    >>> compiled = compile_graph(make_fx(f)(x), [x])
    >>> torch.testing.assert_close(compiled(x), f(x))
    """
    opts = _options(options)  # the settings, under this graph's backend options
    if opts["freezing"]:  # module state -> constants, then this function on the rest
        inner = functools.partial(compile_graph, options={**opts, "freezing": False})
        return freezing.freeze(gm, example_inputs, inner)
    target = wrapper_triton.choose(example_inputs, opts["cpu_backend"])  # printer, device
    if target.printer != "cpp" and (done := _compile_triton(gm, example_inputs, opts, target)):
        return done  # else the Triton printer declined a CPU graph: C++ takes it
    compile_options = cache.CompileOptions.resolve(opts)
    run = _Run()
    run.write("00_input_graph.txt", gm)
    key = _graph_key(gm, example_inputs, compile_options, opts)
    record = graph_cache.load(key) if key is not None else None
    if record is not None and (hit := from_record(gm, record, run)) is not None:
        log.LOG.debug("graph cache hit: %s (no lowering, no code generated)", key)
        return hit
    original = gm
    try:
        lowered, source, args = _generate(run, gm, example_inputs, opts, compile_options)
    except Fallback as e:
        warnings.warn(f"ember.inductor: running the graph eagerly: {e}", stacklevel=2)
        return original.forward
    except Exception as e:  # a bug of ours must not stop the user's program (tests: it must)
        if enabled():
            raise
        warnings.warn(
            f"ember.inductor: internal error, running the graph eagerly: {e!r}", stacklevel=2
        )
        return original.forward
    run.write("05_kernels.cpp", source)
    _log_generated(run, lowered.sched, source)
    compiled = CompiledGraph(lowered.gm, run, lowered.spec)
    compiled.schedule, compiled.source, compiled.kernel_args = lowered.sched, source, args
    if any(isinstance(s, Kernel) for s in lowered.sched.steps):
        compiled._build = cache.build_async(source, compile_options)
    compiled._record = None if key is None else (key, original)
    return compiled


def _generate(
    run: _Run,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    opts: dict[str, Any],
    compile_options: cache.CompileOptions,
) -> tuple[_Lowered, str, dict[str, list[str]]]:
    """The lowered graph, its C++ source and kernel arguments; raises Fallback when the
    graph must run as aten calls."""
    if (kind := subclass_input(example_inputs)) is not None:  # aten calls keep its type
        raise Fallback(f"an input is a {kind.__name__}, whose type eager keeps in outputs")
    if (node := _data_dependent(gm)) is not None:
        raise Fallback(f"{node}: an unbacked size (mark_unbacked, or from data: nonzero, masking)")
    fused_random = not opts["fallback_random"]
    nhwc = opts.get("conv_channels_last", True)
    printer = "cpp" if opts.get("target") is None else "triton"
    decomposed, prog = _lower(run, gm, example_inputs, fused_random, nhwc, printer)  # loop IR
    with timing.TIMES.timed("scheduling"):  # timing: for ember.compiler.compile_times()
        updates = input_updates(gm, example_inputs)  # mutated inputs: written in place
        owned = owned_inputs(gm)  # a backward's saved values: freed at their last use
        sched = run.phase("schedule", schedule, prog, updates, printer, owned)  # fusion, memory
    with timing.TIMES.timed("codegen"):
        if (target := opts.get("target")) is not None:  # a Triton module
            source, args = run.phase("codegen", wrapper_triton.codegen, sched, target)
        else:
            source, args = run.phase("codegen", translation_unit, sched)  # C++ source
    lowered = _Lowered(decomposed, sched, prog.out_spec)
    tunable = prog.size_vars is None  # symbolic sizes: a choice would fit one example only
    if opts["max_autotune"] and tunable and any(isinstance(s, Kernel) for s in sched.steps):
        tuning = _Tuning(gm, example_inputs, fused_random, compile_options, target, nhwc)
        return _autotuned(run, tuning, lowered)
    return lowered, source, args


def _compile_triton(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    opts: dict[str, Any],
    target: wrapper_triton.Target,
) -> Callable[..., Any] | None:
    """The graph with Triton kernels (``target.printer == "triton"``) or as aten calls
    (``"eager"``); None when the Triton printer declines a CPU graph, which C++ then takes.
    A CUDA graph the printer declines runs as aten calls. A graph seen before loads its
    record and cached module (``triton_cache``)."""
    run = _Run()
    run.write("00_input_graph.txt", gm)
    run.write("target.txt", f"{target}\n")
    log.LOG.info("printer %s on %s: %s", target.printer, target.device, target.reason)
    reason = target.reason
    if target.printer == "triton":
        options = cache.CompileOptions.resolve(opts)  # (read by C++ autotuning only)
        key = triton_cache.graph_key(_graph_key(gm, example_inputs, options, opts), target)
        record = graph_cache.load(key) if key is not None else None
        in_background = _in_background(gm, target, opts["background_compile"])
        if record is not None and (hit := from_record(gm, record, run, target)):
            hit.in_background = in_background
            return hit
        try:
            with_target = {**opts, "target": target}
            lowered, source, args = _generate(run, gm, example_inputs, with_target, options)
            kernels = wrapper_triton.load(source, lowered.sched)
        except (Fallback, Unsupported) as e:
            reason = f"the Triton printer declined: {e}"
        else:
            run.write("05_kernels.py", source)
            _log_generated(run, lowered.sched, source)
            compiled = CompiledGraph(lowered.gm, run, lowered.spec)
            compiled.schedule, compiled.source, compiled.kernel_args = lowered.sched, source, args
            compiled.target, compiled._kernels = target, kernels
            compiled._record = None if key is None else (key, gm)
            compiled.in_background = in_background
            return compiled
    run.write("target.txt", f"{target}\nfell back: {reason}\n")
    if target.device == "cpu":
        log.LOG.info("C++ printer instead: %s", reason)
        return None
    warnings.warn(f"ember.inductor: running the graph eagerly: {reason}", stacklevel=3)
    return gm.forward


def _in_background(gm: torch.fx.GraphModule, target: wrapper_triton.Target, mode: str) -> bool:
    """Whether the graph's Triton kernels may build on a worker while its first calls run
    as aten calls (:mod:`ember.inductor.background`); the log says why not."""
    refusal = background.refusal(gm, target.device, mode)
    if refusal is None and settings.section.get().cudagraphs:
        refusal = "CUDA graphs record the kernels (mode='reduce-overhead')"
    if refusal is not None:
        log.LOG.info("kernels build on the first call: %s", refusal)
    return refusal is None


def _data_dependent(gm: torch.fx.GraphModule) -> str | None:
    """The first node whose tensor has an unbacked size (``nonzero``, masking): kernels take
    every size from the inputs, so such a graph runs as aten calls. (An unbacked number,
    ``.item()``, is a run-time number kernels take as an argument.)"""
    for node in gm.graph.nodes:
        tensors = [
            v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)
        ]
        if any(free_unbacked_symbols((t.shape, t.stride())) for t in tensors):
            return str(node.name)
    return None


def _log_generated(run: _Run, sched: Any, source: str) -> None:
    """The schedule, output_code and perf artifacts of one compiled graph."""
    log.artifact("schedule", lambda: str(sched))
    log.artifact("output_code", lambda: source)
    log.artifact("perf", lambda: ", ".join(f"{k} {v:.3f} s" for k, v in run.times.items()))


def _lower(
    run: _Run,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    fused_random: bool,
    channels_last: bool = True,
    printer: str = "cpp",
) -> tuple[torch.fx.GraphModule, Any]:
    """The decomposed graph and its loop-IR program, simplified (the ``lowering`` phase),
    for ``printer`` (``"cpp"`` or ``"triton"``)."""
    with timing.TIMES.timed("lowering"):
        gm = run.phase("decompose", decompose, gm, example_inputs)  # composite ops -> primitives
        if fills.applies(gm):  # (a trace file only where it does: later files one higher)
            gm = run.phase("fresh_fills", fills.fresh_fills, gm)  # a fill per in-place scatter
        if channels_last and layout_conv.applies(gm):  # (a trace file only where it may)
            gm = run.phase("layout", layout_conv.channels_last_convolutions, gm)  # NHWC convs
        lower = functools.partial(lower_graph, fused_random=fused_random, printer=printer)
        prog = run.phase("lower", lower, gm, example_inputs)  # aten -> loop IR
        prog.out_spec = _out_spec(gm)
        prog = run.phase("eliminate_dead", eliminate_dead, prog)  # drop unread nodes
        prog = run.phase("simplify", simplify, prog)  # algebra, constant folding, index math
    return gm, prog


def subclass_input(example_inputs: Sequence[Any]) -> type | None:
    """The type of the first input whose ops' results keep its type, or None.

    Eager wraps the result of an op on a ``torch.Tensor`` subclass in that subclass
    (through ``__torch_function__``); generated kernels return plain tensors, so a
    graph with such an input runs as aten calls, which wrap as eager does.
    ``nn.Parameter`` (and fake tensors) disable ``__torch_function__``: their
    results are plain tensors in eager too.

    >>> class Tagged(torch.Tensor):
    ...     pass
    >>> subclass_input([torch.ones(1), torch.nn.Parameter(torch.ones(1))]) is None
    True
    >>> subclass_input([torch.ones(1).as_subclass(Tagged)]).__name__
    'Tagged'
    """
    for t in example_inputs:
        kind = type(t)
        if isinstance(t, torch.Tensor) and kind is not torch.Tensor:
            if kind.__torch_function__ is not torch._C._disabled_torch_function_impl:
                return kind
    return None


def _options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The settings ``compile_graph`` reads, under this graph's backend ``options``."""
    now = settings.section.get()
    opts = {
        "graph_cache": now.graph_cache,
        "fallback_random": now.fallback_random,
        "max_autotune": now.max_autotune,
        "freezing": now.freezing,
        "cpu_backend": now.cpu_backend,
        "conv_channels_last": now.conv_channels_last,
        "background_compile": now.background_compile,
    } | (options or {})
    if opts["background_compile"] not in background.MODES:
        raise ValueError(
            f"background_compile={opts['background_compile']!r}: choose one of {background.MODES}"
        )
    return opts


def _graph_key(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: cache.CompileOptions,
    opts: dict[str, Any],
) -> str | None:
    """The graph-cache key (None: not cached, by request or for want of a key)."""
    if not opts.get("graph_cache", 1) or subclass_input(example_inputs) is not None:
        return None
    try:
        key = graph_cache.graph_key(gm, example_inputs, options)
    except graph_cache.Unencodable:
        return None
    if not opts.get("fallback_random", True):
        key = hashlib.sha256(f"{key} fused_random".encode()).hexdigest()
    if opts.get("max_autotune"):
        key = hashlib.sha256(f"{key} max_autotune".encode()).hexdigest()
    if CALLED_BOXED.get():  # its record's wrapper is boxed (compiled.CompiledGraph.boxed)
        key = hashlib.sha256(f"{key} boxed".encode()).hexdigest()
    if not opts.get("conv_channels_last", True):
        key = hashlib.sha256(f"{key} no conv_channels_last".encode()).hexdigest()
    if updates := input_updates(gm, example_inputs):  # kernels that write into inputs
        key = hashlib.sha256(f"{key} updates {sorted(updates.items())}".encode()).hexdigest()
    return key


def owned_inputs(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The names of the inputs only a boxed call of ``gm`` holds (``ember.aotgraph``'s hint
    :func:`~ember.aotgraph.hints.owned_inputs`: a backward graph's saved values), whose
    memory the wrapper frees at their last use.

    >>> from ember.aotgraph.hints import mark_owned_inputs
    >>> gm = torch.fx.symbolic_trace(lambda primals_1, mul, tangents_1: tangents_1 * mul)
    >>> mark_owned_inputs(gm)
    >>> sorted(owned_inputs(gm))
    ['mul']
    """
    places = gm.graph.find_nodes(op="placeholder")
    return frozenset(places[k].name for k in hints.owned_inputs(gm))


def input_updates(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[int, int]:
    """``ember.aotgraph``'s hint on ``gm`` (output position -> position of the input it is the
    new value of; :mod:`ember.aotgraph.hints`), without inputs that are not tensors or that
    share storage with another input: the scheduler may then write those outputs into the
    inputs' memory.

    >>> from ember.aotgraph.hints import mark_input_updates
    >>> gm = torch.fx.symbolic_trace(lambda x, y: (x + y,))
    >>> mark_input_updates(gm, {0: 0})
    >>> x = torch.zeros(4)
    >>> input_updates(gm, [x, torch.ones(4)]), input_updates(gm, [x, x[:2]])
    ({0: 0}, {})
    """
    found = hints.input_updates(gm)
    if not found:
        return {}
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    storages = [t.untyped_storage()._cdata for t in tensors]
    out = {}
    for k, i in found.items():
        t = example_inputs[i] if 0 <= i < len(example_inputs) else None
        if isinstance(t, torch.Tensor) and storages.count(t.untyped_storage()._cdata) == 1:
            out[k] = i
    return out


@dataclass(frozen=True, slots=True)
class _Lowered:
    """A graph lowered and scheduled: the decomposed graph, its schedule, its output spec."""

    gm: torch.fx.GraphModule
    sched: Schedule
    spec: Any


@dataclass(frozen=True)
class _Tuning:
    """What autotuning a graph needs: the graph to lower again (a lowering knob), its
    example inputs, and the printer (``target``: Triton; None: C++)."""

    original: torch.fx.GraphModule
    example_inputs: Sequence[Any]
    fused_random: bool
    options: cache.CompileOptions
    target: wrapper_triton.Target | None
    channels_last: bool = True


def _autotuned(
    run: _Run, tuning: _Tuning, default: _Lowered
) -> tuple[_Lowered, str, dict[str, list[str]]]:
    """The lowering, source and kernel arguments of the fastest :mod:`autotune` choice
    (C++: :func:`~ember.inductor.autotune.candidates`; Triton: its block sizes and warps,
    :func:`~ember.inductor.autotune.triton_candidates`). A choice that changes lowering
    (``Knobs.lowering``) lowers the graph again, once per distinct lowering, quietly (no
    trace files)."""
    lowerings = {Knobs().lowering: default}
    made: dict[str, tuple[Knobs, _Lowered, dict[str, list[str]]]] = {}  # source -> its parts
    target = tuning.target

    def source(chosen: Knobs) -> str:
        with knobs(chosen):
            if chosen.lowering not in lowerings:
                gm, prog = _lower(
                    _Run(trace=False),
                    tuning.original,
                    tuning.example_inputs,
                    tuning.fused_random,
                    tuning.channels_last,
                    "cpp" if target is None else "triton",
                )
                updates = input_updates(tuning.original, tuning.example_inputs)
                printer = "cpp" if target is None else "triton"
                sched = schedule(prog, updates, printer, owned_inputs(tuning.original))
                lowerings[chosen.lowering] = _Lowered(gm, sched, prog.out_spec)
            lowered = lowerings[chosen.lowering]
            if target is None:
                text, args = translation_unit(lowered.sched)
            else:
                text, args = wrapper_triton.codegen(lowered.sched, target)
        made.setdefault(text, (chosen, lowered, args))  # the first (the default) wins ties
        return text

    def prepare(text: str, inputs: list[Any]) -> Callable[[], Any]:
        _, lowered, args = made[text]
        trial = CompiledGraph(lowered.gm, _Run(trace=False), lowered.spec)
        trial.schedule, trial.source, trial.kernel_args = lowered.sched, text, args
        if target is None:
            trial._build = cache.build_async(text, tuning.options)  # builds run side by side
        else:
            trial.target, trial._kernels = target, wrapper_triton.load(text, lowered.sched)
        return functools.partial(trial, *inputs)

    trials, per_kernel = None, None
    if target is not None:
        trials = autotune.triton_candidates()
        per_kernel = _per_kernel(target, source, lowerings, made)
    with timing.TIMES.timed("autotune"):
        choice = autotune.choose(source, tuning.example_inputs, prepare, trials, per_kernel)
    run.write("07_autotune.txt", choice)
    text = source(choice.knobs)
    if choice.per_kernel:
        assert per_kernel is not None
        text = per_kernel.mixed(choice.knobs, dict(choice.per_kernel))
    _, lowered, args = made[text]
    return lowered, text, args


def _per_kernel(
    target: wrapper_triton.Target,
    source: Callable[[Knobs], str],
    lowerings: dict[Any, _Lowered],
    made: dict[str, tuple[Knobs, _Lowered, dict[str, list[str]]]],
) -> autotune.PerKernel:
    """How :func:`_autotuned` times a Triton module's kernels one by one, and writes a module
    whose kernels each take knobs of their own (``made``: each source's parts)."""

    def mixed(chosen: Knobs, per_kernel: dict[str, Knobs]) -> str:
        source(chosen)  # (its lowering, made once)
        lowered = lowerings[chosen.lowering]
        with knobs(chosen):
            text, args = wrapper_triton.codegen(lowered.sched, target, per_kernel)
        made.setdefault(text, (chosen, lowered, args))
        return text

    def kernel_times(text: str, inputs: list[Any]) -> dict[str, float]:
        _, lowered, args = made[text]
        spent: dict[str, list[Any]] = {}
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
        launchers = wrapper_triton.load(text, lowered.sched)
        trial = CompiledGraph(lowered.gm, _Run(trace=False), lowered.spec)
        trial.schedule, trial.source, trial.kernel_args = lowered.sched, text, args
        trial.target = target
        trial._kernels = {
            name: autotune.timed_launcher(fn, name, spent, cuda) for name, fn in launchers.items()
        }
        return autotune.kernel_seconds(functools.partial(trial, *inputs), spent, cuda)

    return autotune.PerKernel(kernel_times, mixed)


def _out_spec(gm: torch.fx.GraphModule) -> Any:
    """The output structure ``gm`` returns, for graphs that flatten it (pytree codegen)."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is not None and info.out_spec is not None:
        return info.out_spec
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return pytree.tree_flatten(out.args[0])[1]
