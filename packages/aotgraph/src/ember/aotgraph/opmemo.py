"""A memo of ``make_fx``'s work per aten op: repeated layers are decomposed and traced once.

``make_fx`` handles each aten op the traced function dispatches (``proxy_call``): it runs
the op's decomposition, whose ops dispatch again, runs each leaf op on fake tensors, and
records one graph node per leaf op with its fake value. A transformer stack dispatches the
same ops, on tensors of the same sizes, once per layer: an hf-gpt2 of 12 layers dispatches
``native_layer_norm`` 25 times, and its decomposition records 10 nodes each time.

While :func:`memoized` is active, the first dispatch of an op with a given *key* runs as
before and its recorded nodes become a template; a later dispatch with the same key stamps
the template into the graph instead: each node is created through the tracer (so its name,
``stack_trace``, ``nn_module_stack``, ``from_node``, ``seq_nr`` and ``torch_fn`` come from
the current captured node, as they would), and its fake value is a fresh fake tensor with
the recorded layout (ops returning new memory), a view op's value made as a hit in torch's
fake-tensor cache makes it (an empty fake of the recorded layout set onto the viewed
argument's storage: not dispatched again), or the leaf op run again on the fakes (anything
else), so storage sharing is the op's own. Autograd, the
``ADInplaceOrView`` wrapping of views and torch-function bookkeeping run above this level
as before.

The key: the op, the structure and constants of its arguments, and for each tensor
argument its size, stride, storage offset, dtype, device, ``requires_grad``, whether it is
a view, its storage's size, and which earlier argument it is (the same tensor, the same
graph node) or shares storage with; plus the decomposition table and the dispatch state.
What is not memoized (the op runs as before): random, data-dependent and mutating ops,
ops outside ``aten`` and ``prims`` (a custom op's fake kernel is user code), arguments
that are not fake tensors of this trace, symbolic sizes, constants tracked for
propagation, and any op whose recording is not plain (nodes that are not aten calls or
their tuple items, references to graph nodes other than the arguments').

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def two_norms(x):
...     y = torch.nn.functional.layer_norm(x, (4,))
...     return torch.nn.functional.layer_norm(y, (4,))
>>> table = {torch.ops.aten.native_layer_norm.default:
...          torch._decomp.decomposition_table[torch.ops.aten.native_layer_norm.default]}
>>> with torch.no_grad(), memoized() as memo:
...     gm = make_fx(two_norms, table, tracing_mode="fake")(torch.ones(2, 4))
>>> memo.hits, memo.misses
(1, 1)
>>> with torch.no_grad():
...     plain = make_fx(two_norms, table, tracing_mode="fake")(torch.ones(2, 4))
>>> gm.code == plain.code
True
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_impls import fast_detach
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.fx import traceback as fx_traceback
from torch.fx.experimental import proxy_tensor
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.fx.node import map_aggregate

from ember.aotgraph import settings

__all__ = ["Memo", "if_enabled", "memoized"]

_ACTIVE: contextvars.ContextVar[Memo | None] = contextvars.ContextVar("ember_opmemo", default=None)
_MISSING = object()  # a meta key that was not set
_UNUSABLE = object()  # a key whose op is not memoized: run it as before

# ops whose graph depends on more than their arguments' layout, or that write
_REFUSED_TAGS = (
    torch.Tag.nondeterministic_seeded,
    torch.Tag.data_dependent_output,
    torch.Tag.dynamic_output_shape,
    torch.Tag.inplace_view,
)
# torch's own ops (a custom op's fake kernel may count its calls, or raise on data)
_NAMESPACES = frozenset({"aten", "prims"})
# ops that make tracked constants (torch.tensor)
_CONSTANTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
# argument values keyed by value (type, value): immutable, hashable, compared exactly
_PLAIN = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_SEQUENCES = (tuple, list, immutable_list, torch.Size)


class _NotMemoized(Exception):
    """This op, with these arguments, runs as before."""


@dataclass(frozen=True, slots=True)
class _Ref:
    """An argument of a recorded node: input tensor ``index`` or recorded node ``index``."""

    made: bool
    index: int


@dataclass(frozen=True, slots=True)
class _Fresh:
    """A leaf op's value made anew: an empty fake tensor of this layout (the op returns new
    memory, checked when it was recorded)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True, slots=True)
class _View:
    """A view op's value made anew as a hit in torch's fake-tensor cache makes it: an empty
    fake tensor of this layout set onto the storage of the op's argument ``arg``."""

    arg: int  # the position, among the op's arguments, of the tensor it views
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True, slots=True)
class _Step:
    """One recorded node: how to create it and its value, or (``parent`` set) the tuple item
    that tracking its parent's value creates."""

    target: Any
    args: Any  # with _Ref leaves
    kwargs: Any
    name: str | None
    type_expr: Any
    fn: Any  # the torch function it was recorded under (None: none of this op's own)
    fn_count: int  # that function's calls during the op so far
    aten: Any  # meta "original_aten" when it was created (_MISSING: unset)
    fresh: tuple[_Fresh | _View, ...] | None  # values made anew; None: run the leaf op again
    many: Any  # the container the op returns (tuple, list), or None: one tensor
    tensor_meta: Any  # the node's recorded meta "tensor_meta" (None: not set, a tuple)
    parent: int = -1  # a tuple item: the index of the step making the tuple, and the item
    item: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one op with one key recorded: its steps, its result (with _Ref leaves) and what it
    did to the tracer's torch-function counts."""

    steps: tuple[_Step, ...]
    result: tuple[Any, Any]  # (how to rebuild the container or None: a tensor, its leaves)
    fn_delta: tuple[tuple[Any, int], ...]
    fn_last: Any


@dataclass
class Memo:
    """The templates of one trace, by key; ``hits`` and ``misses`` count stamped and recorded
    ops (ops not memoized count as neither).

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> with torch.no_grad(), memoized() as memo:  # two sins of one layout: one stamped
    ...     gm = make_fx(lambda x: x.sin().sin(), tracing_mode="fake")(torch.ones(2))
    >>> memo.hits, memo.misses, [n.name for n in gm.graph.nodes]
    (1, 1, ['x_1', 'sin', 'sin_1', 'output'])
    """

    entries: dict[Any, Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    depth: int = 0  # > 0 while an op records: its inner ops run as before

    def call(self, mode: Any, func: Any, pre_dispatch: bool, args: Any, kwargs: Any) -> Any:
        """``proxy_call(mode, func, pre_dispatch, args, kwargs)``, stamped where recorded."""
        tracer = mode.tracer
        try:
            key, inputs = _key(mode, func, args, kwargs)
            entry = self.entries.get(key)
        except (_NotMemoized, TypeError):  # TypeError: a value in the key is not hashable
            return _PROXY_CALL(mode, func, pre_dispatch, args, kwargs)
        if entry is _UNUSABLE:
            return _PROXY_CALL(mode, func, pre_dispatch, args, kwargs)
        if entry is not None:
            self.hits += 1
            return _stamp(entry, tracer, inputs)
        self.depth += 1
        try:
            out, entry = _record(mode, func, pre_dispatch, args, kwargs, inputs)
        finally:
            self.depth -= 1
        self.entries[key] = _UNUSABLE if entry is None else entry
        self.misses += entry is not None
        return out


@contextlib.contextmanager
def memoized() -> Iterator[Memo]:
    """Memoize ``make_fx``'s per-op work in the block (see the module docstring); the
    hook in ``make_fx`` is there only while a block runs.

    >>> from torch.fx.experimental import proxy_tensor
    >>> with memoized():
    ...     proxy_tensor.proxy_call is _PROXY_CALL
    False
    >>> proxy_tensor.proxy_call is _PROXY_CALL
    True
    """
    memo = Memo()
    token = _ACTIVE.set(memo)
    _install()
    try:
        yield memo
    finally:
        _uninstall()
        _ACTIVE.reset(token)


def if_enabled() -> contextlib.AbstractContextManager[Memo | None]:
    """:func:`memoized`, unless the ``trace_memo`` setting is off.

    >>> with settings.section.patch(trace_memo=False), if_enabled() as memo:
    ...     memo is None
    True
    """
    return memoized() if settings.section.get().trace_memo else contextlib.nullcontext()


# -- the hook in torch's proxy_call ------------------------------------------------------------

_PROXY_CALL = proxy_tensor.proxy_call
_LOCK = threading.Lock()
_users = [0]  # active blocks (threads may overlap); the first installs, the last removes


def _proxy_call(mode: Any, func: Any, pre_dispatch: bool, args: Any, kwargs: Any) -> Any:
    memo = _ACTIVE.get()
    if memo is None or memo.depth:
        return _PROXY_CALL(mode, func, pre_dispatch, args, kwargs)
    return memo.call(mode, func, pre_dispatch, args, kwargs)


def _install() -> None:
    with _LOCK:
        if _users[0] == 0:
            proxy_tensor.proxy_call = _proxy_call  # type: ignore[assignment]  # read as a global
        _users[0] += 1


def _uninstall() -> None:
    with _LOCK:
        _users[0] -= 1
        if _users[0] == 0:
            proxy_tensor.proxy_call = _PROXY_CALL


# -- keys ----------------------------------------------------------------------------------------


def _key(mode: Any, func: Any, args: Any, kwargs: Any) -> tuple[Any, list[Any]]:
    """The op's key and its tensor arguments in order; raises _NotMemoized."""
    if not isinstance(func, torch._ops.OpOverload) or func._schema.is_mutable:
        raise _NotMemoized
    if func.namespace not in _NAMESPACES:
        raise _NotMemoized  # a custom op's fake kernel is the user's: it runs each time
    if func in _CONSTANTS or mode.emulate_precision_casts:
        raise _NotMemoized
    if any(tag in func.tags for tag in _REFUSED_TAGS):
        raise _NotMemoized
    tracer = mode.tracer
    if getattr(tracer, "record_stack_traces", False):
        raise _NotMemoized  # a node's stack would be the stamping code's
    inputs: list[Any] = []
    shape = _shape((args, kwargs), inputs)
    tensors = []
    tracker = tracer.tensor_tracker
    firsts: dict[Any, int] = {}
    for i, t in enumerate(inputs):
        slot = tracker.get(t)
        if slot is None or slot.constant is not None or t.constant is not None:
            raise _NotMemoized
        size, stride, offset = tuple(t.shape), t.stride(), t.storage_offset()
        if not all(type(s) is int for s in (*size, *stride, offset)):
            raise _NotMemoized  # symbolic sizes: not yet
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if type(nbytes) is not int or t.real_tensor is not None:
            raise _NotMemoized  # a static view of a symbolic tensor; real values kept
        same = firsts.setdefault(("t", id(t)), i)
        node = firsts.setdefault(("n", slot.proxy.node), i)
        shared = firsts.setdefault(("s", storage._cdata), i)
        tensors.append(
            (same, node, shared, size, stride, offset, t.dtype, t.device, t.requires_grad,
             t._is_view(), t.layout, nbytes)
        )  # fmt: skip
    state = (
        id(mode.decomposition_table),
        mode.pre_dispatch,
        torch.is_grad_enabled(),
        torch.get_default_dtype(),  # a decomposition's factory calls may read these two
        torch.are_deterministic_algorithms_enabled(),
        torch._C._dispatch_tls_local_include_set().raw_repr(),
        torch._C._dispatch_tls_local_exclude_set().raw_repr(),
    )
    return (func, shape, tuple(tensors), state), inputs


def _shape(value: Any, inputs: list[Any]) -> Any:
    """``value``'s structure and constants, hashable, with each fake tensor appended to
    ``inputs`` (a ``"T"`` in its place)."""
    kind = type(value)
    if kind is FakeTensor:
        inputs.append(value)
        return "T"
    if kind in _SEQUENCES:
        return (kind, tuple(_shape(v, inputs) for v in value))
    if kind is dict or kind is immutable_dict:
        return (kind, tuple((k, _shape(v, inputs)) for k, v in value.items()))
    if kind is float:
        return (float, value.hex())  # -0.0 apart from 0.0
    if kind in _PLAIN:
        return (kind, value)
    raise _NotMemoized


# -- recording -----------------------------------------------------------------------------------


@dataclass
class _Made:
    node: torch.fx.Node
    kind: str
    target: Any
    args: Any
    kwargs: Any
    name: str | None
    type_expr: Any
    fn: Any
    fn_count: int
    aten: Any


def _record(
    mode: Any, func: Any, pre_dispatch: bool, args: Any, kwargs: Any, inputs: list[Any]
) -> tuple[Any, _Entry | None]:
    """Run ``proxy_call``, noting every node the tracer creates; the result and the entry."""
    tracer = mode.tracer
    counts: dict[Any, int] = tracer.torch_fn_counts
    before = dict(counts)
    first_fn = tracer.torch_fn_metadata
    graph = tracer.graph
    n_before = len(graph.nodes)
    made: list[_Made] = []
    create = tracer.create_node

    def noting(
        kind: str, target: Any, a: Any, kw: Any, name: Any = None, type_expr: Any = None
    ) -> torch.fx.Node:
        fn = tracer.torch_fn_metadata
        ran = counts.get(fn, 0) - before.get(fn, 0) if fn is not None else 0
        aten = fx_traceback.get_current_meta().get("original_aten", _MISSING)
        node: torch.fx.Node = create(kind, target, a, kw, name, type_expr)
        made.append(_Made(node, kind, target, a, kw, name, type_expr, fn, ran, aten))
        return node

    tracer.create_node = noting
    try:
        out = _PROXY_CALL(mode, func, pre_dispatch, args, kwargs)
    finally:
        del tracer.create_node
    if len(graph.nodes) - n_before != len(made) or not made:
        return out, None
    delta = tuple((f, c - before.get(f, 0)) for f, c in counts.items() if c != before.get(f, 0))
    last = tracer.torch_fn_metadata
    if last is not first_fn and last not in dict(delta):
        return out, None
    try:
        return out, _entry(tracer, made, inputs, out, delta, last)
    except Exception:  # _NotMemoized, or a recording this module does not understand: the
        return out, None  # op ran as before either way; only its repeats are not stamped


def _entry(
    tracer: Any, made: list[_Made], inputs: list[Any], out: Any, delta: Any, last: Any
) -> _Entry:
    tracker = tracer.tensor_tracker
    input_nodes: dict[torch.fx.Node, int] = {}
    for i, t in enumerate(inputs):
        input_nodes.setdefault(tracker[t].proxy.node, i)
    index = {m.node: j for j, m in enumerate(made)}
    storages = {t.untyped_storage()._cdata for t in inputs}

    def ref(value: Any) -> Any:
        if not isinstance(value, torch.fx.Node):
            if isinstance(value, torch.fx.Proxy):
                raise _NotMemoized
            return value
        j = index.get(value)
        if j is not None:
            if not isinstance(made[j].node.meta.get("val"), torch.Tensor):
                raise _NotMemoized  # a tuple-valued node read whole
            return _Ref(True, j)
        i = input_nodes.get(value)
        if i is None:
            raise _NotMemoized  # a node from elsewhere in the graph
        return _Ref(False, i)

    fakes = {node: inputs[i] for node, i in input_nodes.items()}  # arguments' fakes; a made
    fakes.update((m.node, m.node.meta.get("val")) for m in made)  # node's val: same storage
    steps: list[_Step] = []
    pending: list[tuple[int, int]] = []  # (parent, item) of tuple items still to come
    for j, m in enumerate(made):
        if m.kind != "call_function":
            raise _NotMemoized
        if pending:  # the items tracking the parent's tuple creates, in order
            parent, item = pending.pop(0)
            ok = m.target is operator.getitem and m.args == (made[parent].node, item)
            if not ok or not isinstance(m.node.meta.get("val"), torch.Tensor):
                raise _NotMemoized
            steps.append(_step(m, None, None, (_Ref(True, parent), item), {}, parent, item))
            continue
        target = m.target
        if not _plain_op(target):
            raise _NotMemoized
        val: Any = m.node.meta.get("val")
        many = type(val) if type(val) in (tuple, list) else None
        values: list[Any] = list(val) if many is not None else [val]
        if not values or not all(type(v) is FakeTensor for v in values):
            raise _NotMemoized
        pending.extend((j, k) for k in range(len(values)) if many is not None)
        fresh = _fresh_layouts(target, values, storages) or _view_layouts(
            target, values, m.args, fakes.get
        )
        for v in values:
            storages.add(v.untyped_storage()._cdata)
        a, kw = map_aggregate(m.args, ref), map_aggregate(m.kwargs, ref)
        steps.append(_step(m, fresh, many, a, kw))
    if pending:
        raise _NotMemoized
    result = _result(tracer, out, inputs, index)
    return _Entry(tuple(steps), result, delta, last)


def _plain_op(target: Any) -> bool:
    """An ``aten`` or ``prims`` op that writes nothing and is none of :data:`_REFUSED_TAGS`."""
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return False
    refused = any(tag in target.tags for tag in _REFUSED_TAGS)
    return target.namespace in _NAMESPACES and not refused


def _step(
    m: _Made, fresh: Any, many: Any, a: Any, kw: Any, parent: int = -1, item: int = 0
) -> _Step:
    return _Step(m.target, a, kw, m.name, m.type_expr, m.fn if m.fn_count else None,
                 m.fn_count, m.aten, fresh, many, m.node.meta.get("tensor_meta"), parent,
                 item)  # fmt: skip


def _fresh_layouts(target: Any, values: list[Any], storages: set[Any]) -> Any:
    """The layouts to make ``values`` anew from, or None (run the op again): only for ops
    whose schema says every result is new memory, and values that are exactly what an
    empty tensor of their layout is (no offset, no view, the minimal storage)."""
    if any(r.alias_info is not None for r in target._schema.returns):
        return None
    out = []
    for v in values:
        if v._is_view() or v.requires_grad or v.storage_offset() != 0 or v.constant is not None:
            return None
        if v.layout != torch.strided or v.is_conj() or v.is_neg():
            return None
        storage = v.untyped_storage()
        if storage._cdata in storages:
            return None  # shares memory with an argument or an earlier value
        layout = _Fresh(tuple(v.shape), v.stride(), v.dtype, v.device)
        if not all(type(s) is int for s in (*layout.size, *layout.stride)):
            raise _NotMemoized
        if _empty(v.fake_mode, layout).untyped_storage().nbytes() != storage.nbytes():
            return None
        out.append(layout)
    return tuple(out)


def _view_layouts(
    target: Any, values: list[Any], args: Any, fake_of: Callable[[Any], Any]
) -> tuple[_View, ...] | None:
    """How to make the values of a view op anew (see :class:`_View`), or None (run the op
    again): plain tensors sharing the storage of one of its positional arguments (an
    input of the op or a value recorded before it), as ``view``, ``t`` or ``split`` make."""
    if not target.is_view or not isinstance(args, tuple):
        return None
    for v in values:
        if v.requires_grad or v.layout != torch.strided or v.is_conj() or v.is_neg():
            return None
        if v.constant is not None:
            return None
    storages = {v.untyped_storage()._cdata for v in values}
    for k, a in enumerate(args):
        base = fake_of(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(base, FakeTensor) and {base.untyped_storage()._cdata} == storages:
            views = tuple(
                _View(k, tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device)
                for v in values
            )
            for view in views:
                if not all(type(s) is int for s in (*view.size, *view.stride, view.offset)):
                    raise _NotMemoized
            return views
    return None


def _result(tracer: Any, out: Any, inputs: list[Any], index: dict[torch.fx.Node, int]) -> Any:
    """``out`` with each tensor a _Ref: a recorded node's value, or an argument itself."""
    tracker = tracer.tensor_tracker

    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            for i, t in enumerate(inputs):
                if value is t:
                    return _Ref(False, i)
            slot = tracker.get(value)
            j = index.get(slot.proxy.node) if slot is not None else None
            if j is None or slot.constant is not None:
                raise _NotMemoized
            return _Ref(True, j)
        if type(value) in _PLAIN or type(value) is float:
            return value
        raise _NotMemoized

    if isinstance(out, tuple | list):
        return _rebuilder(out), [leaf(v) for v in out]
    return None, leaf(out)


def _rebuilder(out: Any) -> Callable[[list[Any]], Any]:
    """How to make a container like ``out`` from its items: a tuple, a list, a named tuple (a
    decomposition's return type) or a structseq (``torch.return_types``)."""
    kind = type(out)
    if kind in (tuple, list):
        return kind
    if isinstance(out, tuple) and hasattr(kind, "_make"):
        return kind._make  # type: ignore[no-any-return]
    if isinstance(out, tuple) and hasattr(kind, "n_fields"):
        return kind  # a structseq takes a sequence
    raise _NotMemoized


# -- stamping ------------------------------------------------------------------------------------


def _stamp(entry: _Entry, tracer: Any, inputs: list[Any]) -> Any:
    """Create the entry's nodes and values for arguments ``inputs``; the op's result."""
    tracker = tracer.tensor_tracker
    input_nodes = [tracker[t].proxy.node for t in inputs]
    nodes: list[torch.fx.Node] = []
    values: list[Any] = []
    counts = tracer.torch_fn_counts
    start = {f: counts.get(f, 0) for f, _ in entry.fn_delta}
    meta = fx_traceback.get_current_meta()
    aten_before = meta.get("original_aten", _MISSING)

    def node_of(r: Any) -> Any:
        if type(r) is not _Ref:
            return r
        return nodes[r.index] if r.made else input_nodes[r.index]

    def value_of(r: Any) -> Any:
        if type(r) is not _Ref:
            return r
        return values[r.index] if r.made else inputs[r.index]

    try:
        for step in entry.steps:
            if step.fn is not None:
                tracer.torch_fn_metadata = step.fn
                counts[step.fn] = start[step.fn] + step.fn_count
            _set_aten(meta, step.aten)
            a, kw = map_aggregate(step.args, node_of), map_aggregate(step.kwargs, node_of)
            node = tracer.create_node(
                "call_function", step.target, a, kw, step.name, step.type_expr
            )
            if step.parent >= 0:  # a tuple's item
                value = values[step.parent][step.item]
            elif step.fresh is not None:
                mode = _mode_of(inputs)
                made = [
                    _empty(mode, f)
                    if isinstance(f, _Fresh)
                    else _viewed(f, value_of(step.args[f.arg]))
                    for f in step.fresh
                ]
                value = step.many(made) if step.many is not None else made[0]
            else:
                fa, fkw = map_aggregate(step.args, value_of), map_aggregate(step.kwargs, value_of)
                value = step.target(*fa, **fkw)
            _track(tracer, node, value, step)
            nodes.append(node)
            values.append(value)
    finally:
        _set_aten(meta, aten_before)
    for f, n in entry.fn_delta:
        counts[f] = start[f] + n
    if entry.fn_delta:
        tracer.torch_fn_metadata = entry.fn_last
    make, result = entry.result
    if make is None:
        return value_of(result)
    return make([value_of(r) for r in result])


def _track(tracer: Any, node: torch.fx.Node, value: Any, step: _Step) -> None:
    """What ``track_tensor_tree`` does for a node's value with static sizes, less its work:
    the value's proxy, and the node's ``val`` (a detached alias, as ``set_meta`` makes) and
    ``tensor_meta`` (the recorded one: the key fixes every field of it). A tuple's items are
    tracked at their own steps (the ``getitem`` nodes tracking the tuple creates)."""
    if step.many is not None:
        node.meta["val"] = step.many([fast_detach(v.fake_mode, v) for v in value])
        return
    node.meta["val"] = fast_detach(value.fake_mode, value)
    if step.tensor_meta is not None:
        node.meta["tensor_meta"] = step.tensor_meta
    slot = proxy_tensor._ProxyTensor(torch.fx.Proxy(node, tracer), None)
    proxy_tensor.set_proxy_slot(value, tracer, slot)


def _set_aten(meta: dict[str, Any], aten: Any) -> None:
    if aten is _MISSING:
        meta.pop("original_aten", None)
    else:
        meta["original_aten"] = aten


def _mode_of(inputs: list[Any]) -> Any:
    """The fake mode to make values in: the arguments', else the one dispatching now."""
    if inputs:
        return inputs[0].fake_mode
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def _viewed(view: _View, base: FakeTensor) -> FakeTensor:
    """A view of ``base`` with ``view``'s layout, made as torch's fake-tensor cache makes a
    view op's result on a hit (``_get_output_tensor_from_cache_entry``): an empty meta
    tensor of the layout, set onto ``base``'s storage."""
    mode = base.fake_mode
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(view.size, view.stride, dtype=view.dtype, device="meta")
        meta.set_(base.untyped_storage(), view.offset, view.size, view.stride)
    return FakeTensor(mode, meta, view.device)


def _empty(mode: Any, layout: _Fresh) -> FakeTensor:
    """A new fake tensor of ``layout``, made as the fake mode makes an op's result."""
    with in_kernel_invocation_manager(mode):
        meta = torch.empty_strided(layout.size, layout.stride, dtype=layout.dtype, device="meta")
    return FakeTensor(mode, meta, layout.device)
