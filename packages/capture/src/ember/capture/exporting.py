"""``export(f, args)``: capture ``f`` as one standalone graph, with nothing run for real.

The pipeline, one step a line in :func:`export`: bind the call to ``f``'s frame, mark
the dims ``dynamic_shapes`` names, translate the frame (capture's own symbolic
interpreter; any graph break is an :class:`ExportError` listing every break), classify
each graph input by where it came from (a user input by its source, a parameter or
buffer by identity, anything else a constant), find the inputs the graph writes (a fake
run under a dispatch mode that records mutable-schema arguments), and rebuild the graph
with the placeholders in the signature's order and the mutations as outputs.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ember.capture import export_effects, frame_compiler, hook, shapes
from ember.capture.export_program import (
    DimRange,
    ExportedProgram,
    ExportError,
    ExportSignature,
    InputKind,
    InputSpec,
    LeafCheck,
    OutputKind,
    OutputSpec,
    Relation,
)
from ember.capture.tracer import Unsupported
from ember.capture.translate import Translation, translate
from ember.capture.userobjects import make_instance
from ember.guards import Attr, DictItem, Item, Local, ModuleChild, Source, TensorSize
from ember.guards.kinds import GuardKind
from ember.guards.state import BACKEND_VAR

__all__ = ["Dim", "ExportError", "export"]

_SERIAL = itertools.count()


@dataclass(frozen=True, slots=True)
class Dim:
    """A dynamic dimension for ``export(dynamic_shapes=...)``, in the form of torch's ``Dim``:
    dims given the same ``Dim`` must be equal; ``min``/``max`` bound it.

    >>> Dim("batch", min=2, max=64)
    Dim(name='batch', min=2, max=64)
    """

    name: str
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a Dim's name must be an identifier, not {self.name!r}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"Dim {self.name!r}: min {self.min} is above max {self.max}")


def export(
    f: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    strict: bool = True,
) -> ExportedProgram:
    """Capture ``f(*args, **kwargs)`` (a function or an ``nn.Module``) as one graph.

    ``dynamic_shapes`` gives :class:`Dim` s per argument (a tuple in ``args``' order, or a
    dict by parameter name; per tensor a dict ``{dim: Dim}`` or a tuple of ``Dim``/None).
    With ``strict=False`` Python side effects other than tensor mutations (attribute and
    global stores) are dropped with a warning instead of being an error.

    >>> import torch
    >>> def f(x, *, scale):
    ...     return {"y": torch.relu(x) * scale}
    >>> ep = export(f, (torch.ones(2),), {"scale": 3.0})
    >>> ep.module()(torch.ones(2), scale=2.0)
    {'y': tensor([2., 2.])}
    """
    args, kwargs = tuple(args), dict(kwargs or {})
    root, frame = _frame(f, args, kwargs)  # the call, bound to the function's argument slots
    leaves, in_spec = pytree.tree_flatten_with_path((args, kwargs))
    values = [v for _, v in leaves]
    by_source = _leaf_sources(frame, leaves, args, kwargs)  # source -> leaf index
    marks = _marks(dynamic_shapes, frame, values)  # leaf index -> {dim: Dim}
    with _marked(values, marks):
        t = _translate(f, frame, root, args, kwargs)
    specs = _classify(t, by_source, values, root)  # one InputSpec per placeholder
    writes = _written(t)  # the placeholders the graph mutates
    built = _rebuild(t, specs, writes, strict, by_source)
    paths = [_path(p) for p, _ in leaves]
    signature = ExportSignature(
        inputs=tuple(built.inputs),
        outputs=tuple(built.outputs),
        in_spec=pytree.treespec_dumps(in_spec),
        out_spec=pytree.treespec_dumps(built.out_spec),
        checks=_leaf_checks(t, values, paths, marks, built.inputs, by_source),
        dims=_dim_ranges(marks),
        relations=_relations(t, by_source),
        same=_same_tensors(values),
    )
    lifted = {s.target: built.lifted[s.name] for s in built.inputs if s.target}
    state = {s.target: lifted[s.target] for s in built.inputs if s.kind in _STATE and s.target}
    constants = {
        s.target: lifted[s.target]
        for s in built.inputs
        if s.kind is InputKind.CONSTANT_TENSOR and s.target
    }
    program = ExportedProgram(built.gm, signature, state, constants)
    try:
        program.check_inputs(args, kwargs)  # the example must pass the program's own checks
    except ValueError as e:
        raise ExportError(f"the example inputs fail the exported checks: {e}") from None
    return program


_STATE = (InputKind.PARAMETER, InputKind.BUFFER)


def _frame(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[torch.nn.Module | None, hook.MadeFrame]:
    """The frame ``f(*args, **kwargs)`` would run (a module's ``forward``, self bound)."""
    root = f if isinstance(f, torch.nn.Module) else None
    fn: Any = f.forward if root is not None else f
    lead: tuple[Any, ...] = ()
    if isinstance(fn, types.MethodType):
        fn, lead = fn.__func__, (fn.__self__,)
        if isinstance(lead[0], torch.nn.Module):
            root = lead[0]  # m.forward exports as m does
    if not isinstance(fn, types.FunctionType):
        raise ExportError(f"export takes a Python function or an nn.Module, not {f!r}")
    try:
        # the frame that runs is fn's own code: a decorator's (*args, **kwargs) wrapper binds
        # as it is, not as the function it wraps (transformers' forwards are wrapped)
        bound = inspect.signature(fn, follow_wrapped=False).bind(*lead, *args, **kwargs)
    except TypeError as e:
        raise ExportError(f"{fn.__qualname__} cannot be called with these arguments: {e}") from None
    bound.apply_defaults()
    code = fn.__code__
    slots = tuple(bound.arguments[name] for name in hook.argument_names(code))
    builtins = fn.__globals__.get("__builtins__", __builtins__)
    if isinstance(builtins, types.ModuleType):
        builtins = vars(builtins)
    return root, hook.MadeFrame(code, fn, fn.__globals__, builtins, slots, lead)


@dataclass(frozen=True, slots=True)
class _Arg:
    """A stand-in for the user's positional argument ``index`` (or keyword ``key``) while
    binding, to learn which argument slot receives it."""

    index: int | str


def _roots(
    frame: hook.MadeFrame, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[Any, Source]:
    """(0, i) / (1, key) -> the source of that argument in the frame."""
    fn = frame.function
    marks = [_Arg(i) for i in range(len(args))]
    bound = inspect.signature(fn).bind(*frame.lead, *marks, **{k: _Arg(k) for k in kwargs})
    out: dict[Any, Source] = {}
    for name, value in bound.arguments.items():
        slot = inspect.signature(fn).parameters[name].kind
        if slot is inspect.Parameter.VAR_POSITIONAL:
            for j, item in enumerate(value):
                out[(0, item.index)] = Item(Local(name), j)
        elif slot is inspect.Parameter.VAR_KEYWORD:
            for key in value:
                out[(1, key)] = Item(Local(name), key)
        elif isinstance(value, _Arg):
            out[(0 if isinstance(value.index, int) else 1, value.index)] = Local(name)
    return out


def _leaf_sources(
    frame: hook.MadeFrame, leaves: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[Source, int]:
    """Every source through which the frame may read each flattened input."""
    roots = _roots(frame, args, kwargs)
    out: dict[Source, int] = {}
    for index, (path, _) in enumerate(leaves):
        first, second, *rest = path
        key = second.idx if isinstance(second, pytree.SequenceKey) else second.key
        sources = [roots[(first.idx, key)]]
        for step in rest:
            sources = [s for base in sources for s in _step(base, step)]
        for s in sources:
            out.setdefault(s, index)
    return out


def _step(base: Source, step: Any) -> list[Source]:
    """The sources reaching one pytree key of ``base`` (a dict subclass reads past its
    ``__getitem__``; a namedtuple field by name)."""
    if isinstance(step, pytree.SequenceKey):
        return [Item(base, step.idx)]
    if isinstance(step, pytree.MappingKey) and type(step.key) in (int, str):
        return [Item(base, step.key), DictItem(base, step.key)]
    if isinstance(step, pytree.GetAttrKey):
        return [Attr(base, step.name)]
    return []


def _path(path: tuple[Any, ...]) -> str:
    """``args[0]['x']`` / ``kwargs['mask']``: how the user wrote an input."""
    first, *rest = path
    return ("args" if first.idx == 0 else "kwargs") + pytree.keystr(tuple(rest))


def _marks(spec: Any, frame: hook.MadeFrame, values: list[Any]) -> dict[int, dict[int, Dim]]:
    """``dynamic_shapes`` as {leaf index: {dim: Dim}}."""
    if spec is None:
        return {}
    skip = len(frame.lead)
    names = list(hook.argument_names(frame.code))[skip:]
    bound = dict(zip(names, frame.args[skip:], strict=True))
    if isinstance(spec, tuple | list):
        pairs = list(zip(names, spec, strict=False))
    elif isinstance(spec, dict):
        if unknown := sorted(set(spec) - set(names)):
            raise ExportError(f"dynamic_shapes names no argument {unknown} (arguments: {names})")
        pairs = list(spec.items())
    else:
        raise ExportError(f"dynamic_shapes must be a tuple or a dict, not {type(spec).__name__}")
    index = {id(v): i for i, v in reversed(list(enumerate(values)))}
    out: dict[int, dict[int, Dim]] = {}
    for name, entry in pairs:
        _walk_marks(bound[name], entry, name, index, out)
    return out


def _walk_marks(
    value: Any, entry: Any, where: str, index: dict[int, int], out: dict[int, dict[int, Dim]]
) -> None:
    if entry is None:
        return
    if isinstance(value, torch.Tensor):
        dims = dict(enumerate(entry)) if isinstance(entry, tuple | list) else entry
        if not isinstance(dims, dict) or not all(
            isinstance(d, int) and 0 <= d < value.dim() and (m is None or isinstance(m, Dim))
            for d, m in dims.items()
        ):
            raise ExportError(
                f"dynamic_shapes[{where!r}]: {entry!r} is not a dim spec of a"
                f" {value.dim()}-d tensor"
            )
        if id(value) not in index:
            raise ExportError(
                f"dynamic_shapes[{where!r}]: the tensor is not an input the user passed"
            )
        out[index[id(value)]] = {d: m for d, m in dims.items() if m is not None}
    elif (
        isinstance(value, tuple | list)
        and isinstance(entry, tuple | list)
        and len(value) == len(entry)
    ):
        for i, (v, e) in enumerate(zip(value, entry, strict=True)):
            _walk_marks(v, e, f"{where}[{i}]", index, out)
    elif isinstance(value, dict) and isinstance(entry, dict) and set(entry) <= set(value):
        for k, e in entry.items():
            _walk_marks(value[k], e, f"{where}[{k!r}]", index, out)
    else:
        raise ExportError(
            f"dynamic_shapes[{where!r}]: {entry!r} does not match the input's structure"
        )


@contextlib.contextmanager
def _marked(values: list[Any], marks: dict[int, dict[int, Dim]]) -> Iterator[None]:
    """The user's tensors marked dynamic while translating, as they were afterwards."""
    saved = {i: getattr(values[i], shapes._MARKS, None) for i in marks}
    try:
        for i, dims in marks.items():
            for d, dim in dims.items():
                shapes.mark_dynamic(values[i], d, min=dim.min, max=dim.max)
        yield
    finally:
        for i, before in saved.items():
            if before is None:
                delattr(values[i], shapes._MARKS)
            else:
                setattr(values[i], shapes._MARKS, before)


def _translate(
    f: Any, frame: hook.MadeFrame, root: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Translation:
    """The frame as one graph; an :class:`ExportError` listing every break if it is not."""
    name = f"ember.export#{next(_SERIAL)}"
    policy = shapes.Policy(None, automatic=False)  # symbolic where marked, nowhere else
    try:
        with frame_compiler._COMPILE_LOCK:
            t = translate(frame, name, dynamic=policy)
        t.seal()  # the shape relations join the guards
        return t
    except Unsupported as e:
        found = _breaks(f, frame.code, args, kwargs, root) or [_as_failure(frame, e)]
    except shapes.MarkedDynamicError as e:
        raise ExportError(f"a dim dynamic_shapes marks dynamic is not: {e}") from None
    except Exception as bug:  # an error inside capture: named, never a raw traceback
        raise ExportError(f"internal error in ember while exporting: {bug!r}") from bug
    lines = [f"cannot export {frame.code.co_qualname}: {len(found)} graph break(s)"]
    for i, fail in enumerate(found, 1):
        w = fail.where
        at = f"{w.filename}:{w.lineno}: {w.text}" if w else fail.location
        hint = f"\n     hint: {fail.hint}" if fail.hint else ""
        lines.append(f"  {i}. {fail.reason}\n     {at}{hint}")
    raise ExportError("\n".join(lines))


def _as_failure(frame: hook.MadeFrame, e: Unsupported) -> frame_compiler.Failure:
    where = str(e.location) if e.location else frame.code.co_filename
    return frame_compiler.Failure(
        frame.code.co_qualname, e.reason, e.category, where, e.hint, e.location
    )


def _breaks(
    f: Any, code: types.CodeType, args: tuple[Any, ...], kwargs: dict[str, Any], root: Any
) -> list[frame_compiler.Failure]:
    """Every graph break of one run of ``f`` (capture breaks and resumes as
    ``ember.compiler.explain`` does); the module's parameters and buffers and the input
    tensors are restored afterwards, so a failed export leaves them as they were."""
    name = f"ember.export.breaks#{next(_SERIAL)}"
    compiler = frame_compiler.FrameCompiler(
        lambda gm, inputs: gm.forward, name, track=True, entry_codes=(code,)
    )
    inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    saved = [(t, t.detach().clone()) for t in [*_state(root), *inputs]]
    try:
        hook.bound_call(compiler, f, BACKEND_VAR, name)(*args, **kwargs)
    except Exception:  # the run's own error: the breaks found so far are the report
        pass
    finally:
        for c, entry, cache_entry in compiler.made:
            hook.remove_entry(c, entry)
            frame_compiler.code_cache(c).remove(cache_entry)
        with torch.no_grad():
            for t, before in saved:
                t.copy_(before)
    return [*compiler.stats.breaks, *compiler.stats.failures]


def _state(root: Any) -> list[torch.Tensor]:
    if root is None:
        return []
    return [*root.parameters(), *root.buffers()]


def _classify(
    t: Translation, by_source: dict[Source, int], values: list[Any], root: Any
) -> list[InputSpec]:
    """An InputSpec per placeholder, in graph order."""
    names: dict[int, tuple[InputKind, str]] = {}
    if root is not None:  # a tied tensor takes its first name, as state_dict() does
        for n, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), (InputKind.PARAMETER, n))
        for n, b in root.named_buffers(remove_duplicate=False):
            names.setdefault(id(b), (InputKind.BUFFER, n))
    ids = {id(v): i for i, v in reversed(list(enumerate(values))) if isinstance(v, torch.Tensor)}
    specs = []
    placeholders = [n for n in t.graph_module.graph.nodes if n.op == "placeholder"]
    for node, source, real in zip(placeholders, t.input_sources, t.example_inputs, strict=True):
        leaf = by_source.get(source, ids.get(id(real)) if isinstance(real, torch.Tensor) else None)
        if leaf is not None:
            specs.append(InputSpec(InputKind.USER_INPUT, node.name, leaf=leaf))
        elif isinstance(real, torch.Tensor):
            kind, target = names.get(id(real), (InputKind.CONSTANT_TENSOR, _fqn(source)))
            prefix = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_"}.get(kind, "c_")
            specs.append(InputSpec(kind, prefix + target.replace(".", "_"), target=target))
        else:  # a number read from outside the inputs: the graph keeps its value
            specs.append(InputSpec(InputKind.CONSTANT_TENSOR, node.name, target=None))
    return specs


def _fqn(source: Source) -> str:
    """A constant's name from where the frame read it: ``k``, ``layer.scale``, ``G_w``."""
    parts: list[str] = []
    while isinstance(source, Attr | ModuleChild):
        parts.append(source.name)
        source = source.base
    if isinstance(source, Local) and parts:
        return ".".join(reversed(parts))
    return "".join(c if c.isalnum() else "_" for c in str(source)).strip("_") + "".join(
        f".{p}" for p in reversed(parts)
    )


def _stats_written(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """batch norm's running statistics, written in training though its schema says not."""
    return (args[3], args[4]) if len(args) > 5 and args[5] else ()


_aten = torch.ops.aten
# Ops that write arguments their schema does not mark ``(a!)``: op -> the written ones.
_HIDDEN_WRITES: dict[Any, Any] = {
    _aten.native_batch_norm.default: _stats_written,
    _aten.cudnn_batch_norm.default: _stats_written,
    _aten.miopen_batch_norm.default: _stats_written,
}


class _Writes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the storage of every tensor an op writes (a mutable schema argument)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.storages: set[StorageWeakRef] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        written = list(_HIDDEN_WRITES.get(func, lambda a, k: ())(args, kwargs))
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                written += value if isinstance(value, list | tuple) else (value,)
        for x in written:
            if isinstance(x, torch.Tensor):
                self.storages.add(_storage(x))
        return func(*args, **kwargs)


def _storage(x: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(x.untyped_storage())  # type: ignore[no-untyped-call]


def _written(t: Translation) -> set[int]:
    """The placeholder indices whose tensors the graph writes (on fake copies)."""
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in t.example_inputs]
    recorder = _Writes()
    with mode, recorder, torch.no_grad():
        t.graph_module(*fakes)
    return {
        i
        for i, x in enumerate(fakes)
        if isinstance(x, torch.Tensor) and _storage(x) in recorder.storages
    }


# Placeholder order in the exported graph: parameters, buffers, constants, user inputs.
_ORDER = {
    InputKind.PARAMETER: 0,
    InputKind.BUFFER: 1,
    InputKind.CONSTANT_TENSOR: 2,
    InputKind.USER_INPUT: 3,
}


@dataclass(frozen=True, slots=True)
class _Rebuilt:
    gm: torch.fx.GraphModule
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    out_spec: Any
    lifted: dict[str, Any]  # placeholder name -> the value it had while exporting


def _rebuild(
    t: Translation,
    specs: list[InputSpec],
    writes: set[int],
    strict: bool,
    leaf_of: dict[Source, int],
) -> _Rebuilt:
    """The graph with placeholders in signature order, mutations and outputs as outputs."""
    old = t.graph_module.graph
    placeholders = [n for n in old.nodes if n.op == "placeholder"]
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    inputs, lifted, by_source = [], {}, {}
    for i in sorted(
        range(len(specs)), key=lambda i: (_ORDER[specs[i].kind], specs[i].leaf or 0, i)
    ):
        spec, node = specs[i], placeholders[i]
        if spec.kind is InputKind.CONSTANT_TENSOR and spec.target is None:
            env[node] = t.example_inputs[i]  # a number from outside the inputs: kept as is
            continue
        new = g.placeholder(spec.name)
        new.meta = dict(node.meta)
        env[node] = new
        by_source[t.input_sources[i]] = new
        inputs.append(InputSpec(spec.kind, new.name, spec.target, spec.leaf))
        lifted[new.name] = t.example_inputs[i]
    for source in _returned_sources(t.output):  # an input returned as it is, never read
        if source not in by_source and source in leaf_of:
            new = by_source[source] = g.placeholder(str(source).replace("[", "_").strip("]'"))
            inputs.append(InputSpec(InputKind.USER_INPUT, new.name, leaf=leaf_of[source]))
    for node in old.nodes:
        if node.op not in ("placeholder", "output"):
            env[node] = g.node_copy(node, lambda n: env[n])
    outs = [env[n] for n in cast(tuple[torch.fx.Node, ...], old.output_node().args[0])]
    mutations = _mutations(specs, writes, placeholders, env)
    rebound, handled = _rebound_buffers(t, specs, outs, by_source)
    mutations = [m for m in mutations if m[0].target not in rebound] + list(rebound.values())
    export_effects.check(t, strict, handled)
    structure = _part(t.output, outs, by_source)
    leaves, out_spec = pytree.tree_flatten(structure)
    out_node = g.output(tuple([env_node for _, env_node in mutations] + leaves))
    out_node.meta = dict(old.output_node().meta)
    outputs = [spec for spec, _ in mutations] + [
        OutputSpec(OutputKind.USER_OUTPUT, x.name if isinstance(x, torch.fx.Node) else None)
        for x in leaves
    ]
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    gm.graph.lint()
    return _Rebuilt(gm, inputs, outputs, out_spec, lifted)


def _mutations(
    specs: list[InputSpec],
    writes: set[int],
    placeholders: list[torch.fx.Node],
    env: dict[torch.fx.Node, Any],
) -> list[tuple[OutputSpec, torch.fx.Node]]:
    out = []
    for i in sorted(writes):
        spec, node = specs[i], env[placeholders[i]]
        if spec.kind is InputKind.BUFFER:
            out.append((OutputSpec(OutputKind.BUFFER_MUTATION, node.name, spec.target), node))
        elif spec.kind is InputKind.USER_INPUT:
            out.append((OutputSpec(OutputKind.USER_INPUT_MUTATION, node.name, node.name), node))
        else:
            what = spec.target or spec.name
            raise ExportError(
                f"the graph writes {spec.kind.value} {what!r} in place: export supports the"
                " mutation of buffers and of the user's inputs only"
            )
    return out


def _rebound_buffers(
    t: Translation,
    specs: list[InputSpec],
    outs: list[Any],
    by_node: dict[Source, torch.fx.Node],
) -> tuple[dict[str | None, tuple[OutputSpec, Any]], set[int]]:
    """Buffers the function rebinds (``self.count = self.count + 1``), by fully qualified
    name: each a buffer mutation whose new value is the last tensor stored (eager's
    ``nn.Module.__setattr__`` puts it in ``_buffers``; ``.module()`` copies it into the
    buffer). The buffer must be an input (read before) and keep its shape and dtype. Also
    returns the positions of those effects in ``t.effects``."""
    by_source = dict(zip(t.input_sources, specs, strict=True))
    found: dict[str | None, tuple[OutputSpec, Any]] = {}
    handled = set()
    for k, effect in enumerate(t.effects):
        spec = export_effects.rebinding(effect, by_source)
        new = _part(effect[3], outs, by_node) if spec is not None else None
        if spec is None or not isinstance(new, torch.fx.Node):
            continue
        was, now = by_node[t.input_sources[specs.index(spec)]].meta, new.meta
        if export_effects.layout(was.get("example_value")) != export_effects.layout(
            now.get("example_value")
        ):
            raise ExportError(
                f"the function rebinds buffer {spec.target!r} to a tensor of another shape or"
                " dtype: an exported buffer keeps its shape"
            )
        handled.add(k)
        found[spec.target] = (OutputSpec(OutputKind.BUFFER_MUTATION, new.name, spec.target), new)
    return found, handled


def _returned_sources(part: Any) -> Iterator[Source]:
    """The sources a rebuild spec hands back as they are."""
    kind, payload = part
    if kind == "source":
        yield payload
    elif kind in ("tuple", "list"):
        for p in payload:
            yield from _returned_sources(p)
    elif kind == "dict":
        for _, p in payload:
            yield from _returned_sources(p)
    elif kind == "shared":
        yield from _returned_sources(payload[1])


_JSON_CONSTANTS = (type(None), bool, int, float, str)


def _part(part: Any, outs: list[Any], by_source: dict[Source, torch.fx.Node]) -> Any:
    """The return value's rebuild spec (translate's ``Part``) as a pytree of output nodes
    and constants."""
    kind, payload = part
    rule = _PARTS.get(kind)
    found = rule(payload, outs, by_source) if rule is not None else _NO_PART
    if found is _NO_PART:
        raise ExportError(
            f"the function returns a value export cannot rebuild ({kind}: {payload!r})"
        )
    return found


_NO_PART = object()  # a part no rule takes
_Rule = Callable[[Any, list[Any], dict[Source, torch.fx.Node]], Any]
# translate's rebuild spec kind -> the pytree it stands for (or _NO_PART)
_PARTS: dict[str, _Rule] = {
    "out": lambda p, outs, src: outs[p],
    "source": lambda p, outs, src: src.get(p, _NO_PART),  # an input handed back as it is
    "const": lambda p, outs, src: p if isinstance(p, _JSON_CONSTANTS) else _NO_PART,
    "tuple": lambda p, outs, src: tuple(_part(x, outs, src) for x in p),
    "list": lambda p, outs, src: [_part(x, outs, src) for x in p],
    "dict": lambda p, outs, src: (
        {k: _part(x, outs, src) for k, x in p}
        if all(type(k) in (int, str) for k, _ in p)
        else _NO_PART
    ),
    "shared": lambda p, outs, src: _part(p[1], outs, src),  # one object, however named
    "new": lambda p, outs, src: (  # inference-mode outputs: the tensor as the graph has it
        _part(p[1][0], outs, src)
        if p[0].__name__ in ("inference_tensor", "normal_tensor")
        else _NO_PART
    ),
    "object": lambda p, outs, src: _object_part(p, outs, src),
}


def _object_part(payload: Any, outs: list[Any], by_source: dict[Source, torch.fx.Node]) -> Any:
    """An instance made in the frame, of a class torch's pytree knows how to flatten and
    rebuild (transformers registers its ``ModelOutput`` classes): the same instance with
    output nodes in its attributes and items. Another class has no out spec: none."""
    cls, attributes, items = payload
    if cls not in pytree.SUPPORTED_NODES:
        return _NO_PART
    attrs = {name: _part(p, outs, by_source) for name, p in attributes}
    own = None if items is None else {k: _part(p, outs, by_source) for k, p in items}
    return make_instance(cls, attrs, own)


def _specialised(t: Translation) -> set[Source]:
    """Sources whose value a guard pins (beyond their type): a number compared in a branch."""
    found: set[Source] = set()

    def walk(s: Any) -> None:
        if isinstance(s, Source):
            found.add(s)
            for a in getattr(s, "args", ()):
                walk(a)

    for g in t.guards.guards:
        if g.kind not in (GuardKind.TYPE_MATCH, GuardKind.TENSOR_MATCH, GuardKind.SHAPE_RELATION):
            walk(g.source)
    return found


def _leaf_checks(
    t: Translation,
    values: list[Any],
    paths: list[str],
    marks: dict[int, dict[int, Dim]],
    inputs: list[InputSpec],
    by_source: dict[Source, int],
) -> tuple[LeafCheck, ...]:
    """What each flattened input must be: a tensor's dtype and sizes, a graph input
    number's type, every other value as it was (the graph was specialised for it)."""
    graph_leaves = {s.leaf for s in inputs if s.kind is InputKind.USER_INPUT}
    pinned = {by_source[s] for s in _specialised(t) if s in by_source}
    out = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            dims = marks.get(i, {})
            sizes = tuple(dims[d].name if d in dims else int(n) for d, n in enumerate(v.shape))
            out.append(LeafCheck(i, paths[i], "tensor", dtype=str(v.dtype), sizes=sizes))
        elif i in graph_leaves and i not in pinned:
            out.append(LeafCheck(i, paths[i], "number", pytype=type(v).__name__))
        elif isinstance(v, _JSON_CONSTANTS):
            out.append(LeafCheck(i, paths[i], "constant", value=v))
        else:
            raise ExportError(
                f"{paths[i]} is a {type(v).__name__}: export takes tensors, numbers, strings"
                " and containers of them"
            )
    return tuple(out)


def _same_tensors(values: list[Any]) -> tuple[tuple[int, int], ...]:
    """Inputs that are one tensor (``f(x, x)``): the graph reads it once, for both."""
    first: dict[int, int] = {}
    out = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            j = first.setdefault(id(v), i)
            if j != i:
                out.append((j, i))
    return tuple(out)


def _dim_ranges(marks: dict[int, dict[int, Dim]]) -> tuple[DimRange, ...]:
    dims: dict[str, Dim] = {}
    for per_tensor in marks.values():
        for dim in per_tensor.values():
            if dims.setdefault(dim.name, dim) != dim:
                raise ExportError(f"two different Dims are named {dim.name!r}")
    return tuple(DimRange(d.name, d.min, d.max) for d in dims.values())


def _relations(t: Translation, by_source: dict[Source, int]) -> tuple[Relation, ...]:
    """The graph's shape relations over the user's input sizes (layout relations on
    strides are left out: the exported graph is torch-level and takes any strides)."""
    out = []
    for g in t.guards.guards:
        if g.kind is not GuardKind.SHAPE_RELATION:
            continue
        symbols = []
        for name, source in g.expected.symbols:
            if not isinstance(source, TensorSize):
                break
            if source.base not in by_source:
                raise ExportError(
                    f"a shape relation reads {source}, which is not an input: {g.expected}"
                )
            symbols.append((name, by_source[source.base], source.dim))
        else:
            out.append(Relation(g.expected.expr, tuple(symbols)))
    return tuple(out)
