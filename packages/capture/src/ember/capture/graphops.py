"""Adding torch operations to the graph: run them on fake tensors, record an FX node.

:func:`graph_call` is the single way an operation enters the graph. It turns
the symbolic arguments into FX node arguments and fake-tensor arguments, runs
the operation under the tracer's fake mode to learn the result's metadata
(which also validates shapes and dtypes as eager would), records the node, and
wraps the result: tensors become :class:`TensorV`, tuples of tensors become
tuples of ``getitem`` nodes, and Python results (a size, a bool) become
constants.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

from ember.capture import guarding, shapes
from ember.capture.tracer import FrameState, Unsupported
from ember.capture.values import (
    Const,
    DictV,
    ListV,
    SliceV,
    SymV,
    TensorV,
    TupleV,
    Value,
    is_structseq_class,
)

DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)


def as_node_arg(fs: FrameState, v: Value) -> Any:
    """The FX argument for ``v``: a node for a tensor, the value for a constant."""
    return _convert(fs, v, lambda t: t.node)


def as_fake_arg(fs: FrameState, v: Value) -> Any:
    """The fake-mode argument for ``v``: the fake tensor for a tensor, the value for a constant."""
    return _convert(fs, v, lambda t: t.fake if isinstance(t, TensorV) else t.example)


def _convert(fs: FrameState, v: Value, leaf: Any) -> Any:
    if isinstance(v, TensorV | SymV):
        return leaf(v)
    if isinstance(v, Const):
        return v.value
    if isinstance(v, TupleV):
        return tuple(_convert(fs, x, leaf) for x in v.items)
    if isinstance(v, SliceV):
        return slice(*(_convert(fs, x, leaf) for x in v.parts))
    if isinstance(v, ListV):
        return [_convert(fs, x, leaf) for x in fs.tracer.heap.get(v.ref)]
    if isinstance(v, DictV):
        return {k: _convert(fs, x, leaf) for k, x in fs.tracer.heap.get(v.ref).items()}
    if isinstance(getattr(v, "obj", None), torch.Generator):
        # Its state lives outside the graph: the operation runs natively, in order.
        raise Unsupported("a random operation with a generator= argument", "rng")
    raise Unsupported(f"passing {type(v).__name__} {v!r:.80} to a torch operation", "call")


def graph_call(
    fs: FrameState, kind: str, target: Any, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """Record ``target(*args, **kwargs)`` as a ``call_function``/``call_method`` node."""
    wants_grad = kwargs.get("requires_grad")
    if not isinstance(wants_grad, Const | None) or (wants_grad is not None and wants_grad.value):
        # A new leaf that requires grad: a graph traced to aten ops would drop the flag.
        raise Unsupported(f"{_name(target)}(requires_grad=True) inside compiled code", "autograd")
    if _has_symbol([*args, *kwargs.values()]) and not _value_free(fs, kind, target, args, kwargs):
        args = [specialized(fs, a) for a in args]
        kwargs = {k: specialized(fs, v) for k, v in kwargs.items()}
    fake_args = [as_fake_arg(fs, a) for a in args]
    fake_kwargs = {k: as_fake_arg(fs, v) for k, v in kwargs.items()}
    node_args = tuple(as_node_arg(fs, a) for a in args)
    node_kwargs = {k: as_node_arg(fs, v) for k, v in kwargs.items()}
    try:
        with fs.tracer.fake_mode:  # a repeat of an earlier call may come from the memo
            fake = fs.tracer.fake_memo.call(
                fs.tracer.fake_mode, kind, target, fake_args, fake_kwargs
            )
    except DATA_DEPENDENT as e:
        reason = f"{_name(target)} has a data-dependent output ({e})"
        raise Unsupported(reason, "data-dependent") from None
    except UnsupportedOperatorException as e:
        raise Unsupported(f"{_name(target)} cannot run on fake tensors ({e})", "call") from None
    except Exception as e:
        # A genuine user error (shape mismatch, bad dtype): eager raises it for real.
        category = "view-inplace" if _view_rule(e) else "call"
        raise Unsupported(f"{_name(target)} raised {type(e).__name__}: {e}", category) from e
    if not _contains_tensor(fake):
        if shapes.contains_symbolic(fake):  # x.size(0), x.numel() of a symbolic size
            node = fs.tracer.add_node(kind, target, node_args, node_kwargs, fake)
            return symbolic_value(fs, node, fake)
        if target in OFFSET_READS:
            _guard_offsets(fs, args[0])
        if mutates(target, node_kwargs):
            fs.tracer.add_node(kind, target, node_args, node_kwargs, fake)
        return Const(fake)  # sizes, bools, numbers computed from static metadata
    node = fs.tracer.add_node(kind, target, node_args, node_kwargs, fake)
    return wrap_output(fs, node, fake)


# Autograd's rules on in-place writes to views (outputs of chunk/split/unbind, views made
# under no_grad): a graph break would hand the view to the next graph, or back to Python,
# rebuilt as a plain view that the rule no longer covers, so nothing would raise.
VIEW_RULE_ERRORS = ("is a view and is being modified inplace", "is a view and its base")


def _view_rule(e: Exception) -> bool:
    """Whether ``e`` is autograd refusing an in-place write to a view.

    >>> _view_rule(RuntimeError("Output 0 of Split is a view and is being modified inplace"))
    True
    """
    return isinstance(e, RuntimeError) and any(m in str(e) for m in VIEW_RULE_ERRORS)


# Reads of a tensor's storage offset, which the input tensors' match guards do not pin (a
# view at another offset has the same sizes and strides).
OFFSET_READS = ("storage_offset", torch.Tensor.storage_offset)


def _guard_offsets(fs: FrameState, t: Value) -> None:
    """The offset read folds to a constant: guard the offsets it follows from, the tensor's
    own if it is a graph input, else every input tensor's (it may be a view of any)."""
    inputs = fs.tracer.input_tensors()
    if isinstance(t, TensorV) and t.node.op == "placeholder" and t.source is not None:
        inputs = [t]
    for v in inputs:
        offset = guarding.computed(torch.Tensor.storage_offset, (v.source,))
        fs.tracer.guards.equals(offset, v.fake.storage_offset())


def scalar_call(fs: FrameState, fn: Any, args: list[Value]) -> Value:
    """``fn(*args)`` on Python numbers, some of them graph inputs: a node whose result is a
    number too (``1.0 / (1.0 + s)``, ``max(xs)``, ``math.sqrt(s)``)."""
    examples = [a.example if isinstance(a, SymV) else a.value for a in args]  # type: ignore[attr-defined]
    try:
        example = fn(*examples)
    except Exception as e:
        raise Unsupported(f"{_name(fn)}() raised {type(e).__name__}: {e}") from e
    if type(example) not in (int, float, bool) and not isinstance(example, shapes.SYM_TYPES):
        return Const(fn(*(specialized(fs, a).value for a in args)))  # type: ignore[attr-defined]
    node_args = tuple(a.node if isinstance(a, SymV) else a.value for a in args)  # type: ignore[attr-defined]
    node = fs.tracer.add_node("call_function", fn, node_args, {}, example)
    fs.tracer.scalar_nodes.append(node)
    return SymV(node, example)


def specialized(fs: FrameState, v: Value) -> Value:
    """``v`` with every graph-input number in it replaced by its (now guarded) value."""
    if isinstance(v, SymV):
        return Const(fs.tracer.specialize(v))
    if isinstance(v, TupleV):
        return TupleV(tuple(specialized(fs, x) for x in v.items))
    if isinstance(v, ListV) and _has_symbol([v], fs):
        return ListV(fs.tracer.heap.new([specialized(fs, x) for x in fs.tracer.heap.get(v.ref)]))
    return v


def _has_symbol(values: list[Value], fs: FrameState | None = None) -> bool:
    """Whether a graph-input number (not a symbolic size: fake tensors take those) is in
    ``values``."""
    for v in values:
        if isinstance(v, SymV) and not isinstance(v.example, shapes.SYM_TYPES):
            return True
        if isinstance(v, TupleV) and _has_symbol(list(v.items), fs):
            return True
        if isinstance(v, ListV) and fs is not None and _has_symbol(fs.tracer.heap.get(v.ref), fs):
            return True
    return False


def _value_free(
    fs: FrameState, kind: str, target: Any, args: list[Value], kwargs: dict[str, Value]
) -> bool:
    """Whether the result's metadata does not depend on the numbers' values.

    The operation runs on fake tensors a second time with every graph-input number
    moved (``arange(0, n)`` or ``interpolate(scale_factor=s)`` change shape; ``x * s``
    does not). When the metadata differs, or the moved run fails, the numbers are
    specialized instead.
    """

    if mutates(target, kwargs):
        return True  # in-place ops taking numbers (mul_, add_(alpha=), clamp_) keep metadata

    def moved(v: Value) -> Any:
        if isinstance(v, SymV):
            return Const(type(v.example)(v.example * 0.5 + 0.25) if v.example else 0.5)
        return v

    try:
        first = _fake_run(fs, kind, target, args, kwargs)
        second = _fake_run(
            fs, kind, target, [moved(a) for a in args], {k: moved(v) for k, v in kwargs.items()}
        )
    except Exception:
        return False
    return bool(_metadata(first) == _metadata(second))


def _fake_run(
    fs: FrameState, kind: str, target: Any, args: list[Value], kwargs: dict[str, Value]
) -> Any:
    fake_args = [as_fake_arg(fs, a) for a in args]
    fake_kwargs = {k: as_fake_arg(fs, v) for k, v in kwargs.items()}
    fn = getattr(fake_args[0], target) if kind == "call_method" else target
    call_args = fake_args[1:] if kind == "call_method" else fake_args
    with fs.tracer.fake_mode:
        return fn(*call_args, **fake_kwargs)


def _metadata(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad)
    if isinstance(x, tuple | list):
        return tuple(_metadata(i) for i in x)
    return type(x)


def mutates(target: Any, kwargs: dict[str, Any]) -> bool:
    """Whether an operation may write to its arguments (so its node is kept whatever it returns).

    >>> mutates(operator.setitem, {}), mutates("add_", {}), mutates("size", {})
    (True, True, False)
    >>> mutates("__iadd__", {})
    True
    """
    name = _name(target)
    if target is operator.setitem or "out" in kwargs:
        return True
    if target is torch._C._set_grad_enabled:
        return True
    if name.startswith("__i") and name.endswith("__"):
        return True  # __iadd__ and friends
    return name.endswith("_") and not name.endswith("__")


def symbolic_value(fs: FrameState, node: Any, value: Any) -> Value:
    """The value of ``node``, a number or a tuple of numbers some of them symbolic
    (``x.size()``): a :class:`SymV` per symbolic number, a constant for the others."""
    if shapes.is_symbolic(value):
        return SymV(node, value)
    if isinstance(value, tuple | list) and shapes.contains_symbolic(value):
        items: list[Value] = []
        for i, item in enumerate(value):
            if shapes.is_symbolic(item):
                sub = fs.tracer.add_node("call_function", operator.getitem, (node, i), {}, item)
                fs.tracer.ops -= 1  # a getitem is bookkeeping, not an op
                items.append(SymV(sub, item))
            else:
                items.append(Const(int(item) if isinstance(item, torch.SymInt) else item))
        return TupleV(tuple(items))
    return Const(value)


def tensor_sizes(fs: FrameState, v: TensorV, attr: str = "shape") -> Value:
    """``v.shape`` (or another metadata tuple): a constant when every entry is static."""
    value = tuple(getattr(v.fake, attr)) if attr == "shape" else getattr(v.fake, attr)()
    if not shapes.contains_symbolic(value):
        return Const(getattr(v.fake, attr) if attr == "shape" else value)
    node = fs.tracer.add_node(
        "call_method", "size" if attr == "shape" else attr, (v.node,), {}, value
    )
    fs.tracer.ops -= 1  # reading metadata is no work for a backend
    return symbolic_value(fs, node, value)


def wrap_output(fs: FrameState, node: Any, fake: Any) -> Value:
    """The symbolic value of an operation's result ``fake`` produced by ``node``."""
    if isinstance(fake, torch.Tensor):
        return TensorV(node, fake)
    if isinstance(fake, tuple | list):
        items: list[Value] = []
        for i, item in enumerate(fake):
            if isinstance(item, torch.Tensor):
                sub = fs.tracer.add_node("call_function", operator.getitem, (node, i), {}, item)
                fs.tracer.ops -= 1  # a getitem is bookkeeping, not an op
                items.append(TensorV(sub, item))
            elif _contains_tensor(item):
                raise Unsupported("an operation returning nested tensor structures", "call")
            elif shapes.is_symbolic(item):
                sub = fs.tracer.add_node("call_function", operator.getitem, (node, i), {}, item)
                fs.tracer.ops -= 1
                items.append(SymV(sub, item))
            else:
                items.append(Const(item))
        if isinstance(fake, list):
            return ListV(fs.tracer.heap.new(items))
        named = type(fake) if is_structseq_class(type(fake)) else None  # torch.return_types
        return TupleV(tuple(items), cls=named)
    raise Unsupported(f"an operation returning {type(fake).__name__}", "call")


def _contains_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, tuple | list):
        return any(_contains_tensor(i) for i in x)
    return False


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))
