"""Lower an aten-level fx graph to the loop IR.

Each fx node becomes a :class:`Value`: its sizes, dtype and a *loader* that
builds the body expression of one point from an index. Pointwise ops and
views stay lazy (their loaders inline into whoever reads them); a value is
*realized* into a buffer when a reduction or extern needs it, when several
users read it, or when it is an output. Lowerings register next to their code
with ``@lowering(aten.op)``; an op without one, or whose lowering raises
:class:`Fallback`, becomes an :class:`~ember.inductor.ir.Extern` that calls the
aten kernel, so a graph never fails to compile for want of an op.

>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: (x.exp() + 1).sum(1))(torch.randn(4, 8))
>>> print(lower_graph(gm, [torch.randn(4, 8)]))
inputs: x_1
  x_1: float32[4, 8] strides [8, 1]
  buf0: float32[4] strides [1]
buf0[4] = SUM[8](ADD(EXP(x_1[8*i0 + r0]), 1.0))
outputs: buf0
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
from torch._prims_common import (
    is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense,
)
from torch.utils import _pytree as pytree

from ember.inductor.eager_kernels import lacks_kernel
from ember.inductor.indexing import nonnegative
from ember.inductor.ir import (
    Buffer,
    Expr,
    Extern,
    I,
    IndexCheck,
    Layout,
    Node,
    Pointwise,
    Program,
    Reduction,
    Ref,
    Scalar,
    ScalarOp,
    const,
    load,
    scalars,
    walk,
)
from ember.inductor.ops import COMPARE, SEMANTICS, WELFORD, Op, Reduce
from ember.inductor.symbolic import FloatSize, SizeVars, Unsupported, hint, is_static, size_vars

__all__ = [
    "LOWERINGS",
    "SCALAR_OPERANDS",
    "Fallback",
    "Lowerer",
    "Value",
    "lower_graph",
    "lowering",
]

Loader = Callable[[Sequence[sympy.Expr]], Expr]
Lowering = Callable[..., Any]

LOWERINGS: dict[Any, Lowering] = {}  # aten overload -> fn(ctx, *args, **kwargs) -> Value
SCALAR_OPERANDS: set[Any] = set()  # overloads whose lowering takes run-time Scalar operands
INLINE_LIMIT = 120  # body nodes past which a lazy value is realized rather than inlined
ONE_INPUT_RECOMPUTE = 4  # body nodes up to which a heavy value of one buffer is recomputed
MANY_READS = 3  # buffers read by a value with several readers past which it is stored
CHEAP = {Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.ABS, Op.MAX, Op.MIN, Op.WHERE, Op.NOT, Op.ISNAN}
HEAVY = frozenset(SEMANTICS) - CHEAP - COMPARE - {Op.AND, Op.OR, Op.XOR}  # worth storing


# ops whose lowering reads its inputs from memory (an extern call, or a template that
# tiles two buffers): a user of this kind does not compute on an unrealized value
READS_MEMORY: set[Any] = set()


class Fallback(Exception):
    """Raised by a lowering that cannot handle these arguments: run the aten op instead."""


F = TypeVar("F", bound=Lowering)


def lowering(*targets: Any, scalars: bool = False) -> Callable[[F], F]:
    """Register ``fn`` as the lowering of each aten overload (or packet: all overloads).
    ``scalars``: ``fn`` accepts :class:`~ember.inductor.ir.Scalar` operands (numbers known at
    run time only); other lowerings never see one, their node runs as an aten call."""

    def register(fn: F) -> F:
        for target in targets:
            overloads = (
                [getattr(target, o) for o in target.overloads()]  # type: ignore[no-untyped-call]
                if isinstance(target, torch._ops.OpOverloadPacket)
                else [target]
            )
            for t in overloads:
                if t in LOWERINGS:
                    raise KeyError(f"{t} already has a lowering")
                LOWERINGS[t] = fn
                if scalars:
                    SCALAR_OPERANDS.add(t)
        return fn

    return register


@dataclass(frozen=True)
class Value:
    """A tensor during lowering: sizes, dtype and how to load one point of it."""

    sizes: tuple[int, ...]
    dtype: torch.dtype
    loader: Loader
    ref: Ref | None = None  # set when the value is exactly a strided window of a buffer

    @property
    def ndim(self) -> int:
        return len(self.sizes)


class Lowerer:
    """The state of one lowering: buffers, nodes so far, and each fx node's value."""

    def __init__(
        self,
        *,
        fused_random: bool = False,
        sv: SizeVars | None = None,
        device: torch.device | None = None,
        printer: str = "cpp",
    ) -> None:
        self.fused_random = fused_random  # lower random ops (else: torch's kernels)
        # the printer of the kernels, "cpp" or "triton": a whole argmax is two order-free
        # reductions in C++, one that Triton splits across programs (lower_argmax)
        self.printer = printer
        # where the graph's kernels run: a tensor elsewhere (a CPU constant in a CUDA graph)
        # is left to its aten op
        self.device = device or _CPU
        self.sv = sv  # the size symbols of a graph with symbolic sizes (None: all static)
        self.buffers: dict[str, Buffer] = {}
        self.nodes: list[Node] = []
        self.values: dict[torch.fx.Node, Any] = {}
        self.node: torch.fx.Node | None = None  # the fx node being lowered
        self._realized: dict[int, tuple[Value, Ref]] = {}  # holds the value: ids stay unique
        self._count = 0
        self._reductions: dict[tuple[Any, ...], Value] = {}
        self.scalars: dict[str, Scalar] = {}
        self.scalar_ops: list[ScalarOp] = []
        self.index_checks: list[IndexCheck] = []
        self.given: set[str] = set()  # buffers the caller passes in: inputs and constants

    # ---- buffers -------------------------------------------------------------------------
    def new_buffer(self, dtype: torch.dtype, layout: Layout) -> Buffer:
        while f"buf{self._count}" in self.buffers:
            self._count += 1
        buf = Buffer(f"buf{self._count}", dtype, layout)
        self.buffers[buf.name] = buf
        return buf

    def buffer_value(self, buf: Buffer, layout: Layout | None = None) -> Value:
        view = layout or buf.layout
        ref = Ref(buf.name, None if view == buf.layout else view)
        return Value(view.sizes, buf.dtype, lambda idx: load(buf, idx, view), ref)

    # ---- sizes (ints, or sympy expressions over the size symbols) --------------------------
    def num(self, value: Any) -> Any:
        """A size or int of the graph: an int, or a sympy expression (symbolic graphs)."""
        if self.sv is None or isinstance(value, int):
            return value
        try:
            return self.sv.sym(value)
        except Unsupported as e:
            raise Fallback(str(e)) from None

    def shape(self, meta: Any) -> tuple[Any, ...]:
        """``meta``'s sizes (a fake tensor's), ints or sympy expressions."""
        return tuple(self.num(n) for n in meta.shape)

    def strides(self, meta: Any) -> tuple[Any, ...]:
        return tuple(self.num(n) for n in meta.stride())

    @property
    def meta(self) -> Any:
        """The fake output of the fx node being lowered (sizes, strides, dtype)."""
        assert self.node is not None
        return self.node.meta.get("val")

    # ---- realization ---------------------------------------------------------------------
    def realize(self, value: Value, strides: Sequence[int] | None = None) -> Ref:
        """A buffer (or strided window of one) holding ``value``."""
        if value.ref is not None:
            return value.ref
        if id(value) in self._realized:
            return self._realized[id(value)][1]
        layout = Layout(value.sizes, tuple(strides)) if strides else Layout.contiguous(value.sizes)
        buf = self.new_buffer(value.dtype, layout)
        body = value.loader(I[: value.ndim])
        if body.dtype != value.dtype:
            raise AssertionError(f"{buf.name}: body is {body.dtype}, value is {value.dtype}")
        self.nodes.append(Pointwise(buf.name, value.sizes, body))
        ref = Ref(buf.name)
        self._realized[id(value)] = (value, ref)
        return ref

    def realized(self, value: Value, strides: Sequence[int] | None = None) -> Value:
        ref = self.realize(value, strides)
        return self.buffer_value(self.buffers[ref.name], ref.layout)

    def reduction(
        self,
        kind: Reduce,
        ranges: tuple[int, ...],
        reduce_ranges: tuple[int, ...],
        body: Expr,
        dtype: torch.dtype,
    ) -> Value:
        key = (kind, ranges, reduce_ranges, body, dtype)
        if key in self._reductions:  # the same reduction twice (layer norm's mean and var)
            return self._reductions[key]
        if kind is Reduce.SUM and self._welford(ranges, reduce_ranges, body) is not None:
            return self._sum_of_welford(ranges, reduce_ranges, body, dtype)
        if kind in WELFORD and self._welford(ranges, reduce_ranges, body) is None:
            self._sums_into_welford(ranges, reduce_ranges, body)
        buf = self.new_buffer(dtype, Layout.contiguous(ranges))
        node = Reduction(buf.name, ranges, reduce_ranges, kind, body)
        partner = self._welford(ranges, reduce_ranges, body) if kind in WELFORD else None
        if partner is None:
            self.nodes.append(node)
        else:  # right after it, so the scheduler puts both in one stage: one pass computes both
            at = next(k for k, n in enumerate(self.nodes) if getattr(n, "name", None) == partner)
            self.nodes.insert(at + 1, node)
        self._reductions[key] = self.buffer_value(buf)
        return self._reductions[key]

    def _welford(
        self, ranges: tuple[int, ...], reduce_ranges: tuple[int, ...], body: Expr
    ) -> str | None:
        """The buffer of a Welford reduction of ``body`` already lowered, if any."""
        for kind in (Reduce.WELFORD_M2, Reduce.WELFORD_MEAN):
            value = self._reductions.get((kind, ranges, reduce_ranges, body, body.dtype))
            if value is not None and value.ref is not None:
                return value.ref.name
        return None

    def _sums_into_welford(
        self, ranges: tuple[int, ...], reduce_ranges: tuple[int, ...], body: Expr
    ) -> None:
        """Sums of ``body`` lowered before its first Welford reduction (a mean taken before
        the variance) become that pass's mean times the count: the mean is computed where
        the first sum was, and each sum's node becomes a pointwise one."""
        sums = {
            v.ref.name: dtype
            for (kind, r, rr, b, dtype), v in self._reductions.items()
            if kind is Reduce.SUM and (r, rr, b) == (ranges, reduce_ranges, body) and v.ref
        }
        if not sums or body.dtype not in (torch.float32, torch.float64):
            return
        at = next(k for k, n in enumerate(self.nodes) if getattr(n, "name", None) in sums)
        mean = self.new_buffer(body.dtype, Layout.contiguous(ranges))
        self.nodes.insert(
            at, Reduction(mean.name, ranges, reduce_ranges, Reduce.WELFORD_MEAN, body)
        )
        key = (Reduce.WELFORD_MEAN, ranges, reduce_ranges, body, body.dtype)
        self._reductions[key] = self.buffer_value(mean)
        for k, node in enumerate(self.nodes):
            if isinstance(node, Reduction) and node.name in sums:
                total = self._sum_of_welford(ranges, reduce_ranges, body, sums[node.name])
                self.nodes[k] = Pointwise(node.name, ranges, total.loader(I[: len(ranges)]))

    def _sum_of_welford(
        self,
        ranges: tuple[int, ...],
        reduce_ranges: tuple[int, ...],
        body: Expr,
        dtype: torch.dtype,
    ) -> Value:
        """A sum of values whose variance is computed too (layer norm, batch norm, var_mean
        decompositions divide it by the count right away): the Welford pass's mean times the
        count, so the values are read once."""
        mean = self.reduction(Reduce.WELFORD_MEAN, ranges, reduce_ranges, body, body.dtype)
        n = size_const(math.prod(reduce_ranges), body.dtype)

        def loader(idx: Sequence[sympy.Expr]) -> Expr:
            total = Expr(Op.MUL, body.dtype, (mean.loader(idx), n))
            return total if dtype == body.dtype else Expr(Op.CAST, dtype, (total,))

        return Value(ranges, dtype, loader)

    # ---- the graph -----------------------------------------------------------------------
    def lower(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Program:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        inputs = []
        for node, example in zip(placeholders, example_inputs, strict=True):
            inputs.append(node.name)
            if self.sv is not None and isinstance(example, torch.SymInt | int):
                self.values[node] = self._size_input(node, example)
                continue
            if isinstance(example, torch.SymInt | torch.SymBool):  # sizes stay static
                raise Fallback(f"input {node.name} is a {type(example).__name__}")
            if not isinstance(example, torch.Tensor):
                self.values[node] = self.new_scalar(node.name, example)
                continue
            layout = Layout(tuple(example.shape), example.stride())
            if self.sv is not None:  # the traced sizes and strides, symbols included
                val = node.meta["val"]
                layout = Layout(self.shape(val), self.strides(val))
            buf = Buffer(node.name, example.dtype, layout)
            self.buffers[buf.name] = buf
            self.given.add(buf.name)
            self.values[node] = self.buffer_value(buf)
        outputs: list[Any] = []
        constants: dict[str, torch.Tensor] = {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = _fetch(gm, str(node.target))
                if not isinstance(value, torch.Tensor):
                    raise Fallback(f"get_attr {node.target} is a {type(value).__name__}")
                buf = Buffer(node.name, value.dtype, Layout(tuple(value.shape), value.stride()))
                self.buffers[buf.name] = buf
                self.given.add(buf.name)
                constants[buf.name] = value
                self.values[node] = self.buffer_value(buf)
            if node.op == "call_function":
                self.node = node
                self.values[node] = self._lower_node(node)
                self._maybe_realize(node)
            elif node.op == "output":
                outputs = [self._output(a) for a in pytree.tree_leaves(node.args[0])]
            elif node.op not in ("placeholder", "get_attr"):
                raise Fallback(f"{node.op} nodes are not lowered")
        prog = Program(self.buffers, inputs, self.nodes, outputs, constants=constants)
        prog.scalars, prog.scalar_ops = self.scalars, self.scalar_ops
        prog.index_checks = self.index_checks
        prog.size_vars = self.sv
        return prog

    # ---- numbers -------------------------------------------------------------------------
    def new_scalar(self, name: str, example: Any) -> Scalar:
        """The run-time number ``name``, typed by ``example`` (a number or a symbolic one)."""
        dtype = _number_dtype(example)
        if dtype is None:
            raise Fallback(f"input {name} is a {type(example).__name__}, not a tensor")
        self.scalars[name] = Scalar(name, dtype)
        return self.scalars[name]

    def scalar_op(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Scalar:
        """Arithmetic on numbers (``operator.truediv``, ``max``): computed by the wrapper."""
        numbers = Scalar | int | float | bool | sympy.Basic | FloatSize  # sizes too
        if kwargs or not all(isinstance(a, numbers) for a in args):
            raise Fallback(f"{node.name}: {node.target} of a tensor or container, not numbers")
        out = self.new_scalar(node.name, node.meta["val"])
        target, args = _flatten_extremum(node, args, self.scalar_ops)
        self.scalar_ops.append(ScalarOp(out, target, tuple(args)))
        return out

    def _size_input(self, node: torch.fx.Node, example: Any) -> Any:
        """An int input of a symbolic graph: its symbol (kernels take it as a size argument),
        or a run-time number when the trace did not make it a size."""
        val = node.meta.get("val", example)
        try:
            size = self.num(val)
        except Fallback:
            return self.new_scalar(node.name, val)
        assert self.sv is not None
        self.sv.int_inputs[node.name] = size
        return size

    def _lower_node(self, node: torch.fx.Node) -> Any:
        args, kwargs = pytree.tree_map_only(
            torch.fx.Node, self.values.get, (node.args, node.kwargs)
        )
        if node.target is operator.getitem:
            return args[0][args[1]]
        size = self._size_node(node)
        if size is not None:
            return size
        if _number_dtype(node.meta.get("val")) is not None:
            return self.scalar_op(node, args, kwargs)
        fn = LOWERINGS.get(node.target)
        takes = node.target in SCALAR_OPERANDS or not scalars((args, kwargs))
        plain = takes and _plain_meta(node.meta.get("val"), self.sv is not None, self.device)
        if self.sv is not None and not _symbolic_ok(node, args, kwargs):
            fn = None  # a lowering not yet checked on symbolic sizes: the aten op runs it
        # an op eager has no kernel for at these dtypes: the aten call raises eager's error
        if fn is not None and plain and not lacks_kernel(node):
            try:
                return fn(self, *args, **kwargs)
            except Fallback:
                pass
            except (TypeError, ValueError, Unsupported):
                if self.sv is None:
                    raise
                # a comparison of symbolic sizes that sympy cannot decide: never guess
        return self.extern(node, args, kwargs)

    def _size_node(self, node: torch.fx.Node) -> Any:
        """A node computing a size in a symbolic graph (``sym_size``, arithmetic on sizes):
        its value as a sympy expression over the size symbols, or None."""
        val = node.meta.get("val")
        if self.sv is not None and node.target is torch.sym_float and len(node.args) == 1:
            arg = node.args[0]
            size = self.values.get(arg) if isinstance(arg, torch.fx.Node) else None
            return FloatSize(size) if isinstance(size, sympy.Basic) else None
        if self.sv is None or not isinstance(val, torch.SymInt):
            return None
        try:
            return self.sv.sym(val)
        except Unsupported:
            return None

    def _maybe_realize(self, node: torch.fx.Node) -> None:
        value = self.values[node]
        if not isinstance(value, Value) or value.ref is not None:
            return
        body = list(walk(value.loader(I[: value.ndim])))
        readers = sum(
            1
            for u in node.users
            if (u.target in LOWERINGS and u.target not in READS_MEMORY) or u.target in SIZE_READS
        )
        heavy = len(body) > 8 or any(e.op in HEAVY for e in body)
        # recompute cheap values, store costly ones, and store one that reads many buffers:
        # recomputed, it keeps them all alive to its last reader (a residual stream summed
        # anew by each layer's norm holds every layer's summands)
        # A short heavy value of one buffer (SwiGLU's ``silu(gate)``) is recomputed too: stored,
        # it holds a buffer the size of its input until its last reader, in a backward graph
        # across matmuls, while the input stays alive for the readers anyway (hf-llama's
        # training step: 0.26 MiB of its 3.49 peak, for 2% of its time)
        loads = {e.arg[0] for e in body if e.op is Op.LOAD}
        heavy = heavy and not (len(body) <= ONE_INPUT_RECOMPUTE and len(loads) == 1)
        shared = len(node.users) > 1 and (heavy or len(loads) >= MANY_READS)
        if len(body) > INLINE_LIMIT or shared or readers < len(node.users):
            returned = any(u.op == "output" for u in node.users)  # eager's strides, gaps too
            strides = _output_strides if returned else _dense_strides
            self.values[node] = self.realized(value, self._strides(strides, node))

    def _output(self, arg: Any) -> Any:
        if not isinstance(arg, torch.fx.Node):
            return arg
        value = self.values[arg]
        if isinstance(value, Value):
            strides = self._strides(_output_strides, arg)
            if self.sv is not None and strides is None:
                self._compact_output(arg)
            return self.realize(value, strides)
        return value

    def _compact_output(self, node: torch.fx.Node) -> None:
        """A symbolic graph realizes an output compact unless eager's strides are proved
        dense, or a window with gaps, in some order (:func:`_symbolic_strides`); any other
        layout eager gives (one not proved for every size) makes the graph run as aten
        calls, which keep eager's strides. The strides compare as expressions: no guard."""
        meta = node.meta.get("val")
        if not isinstance(meta, torch.Tensor):
            return
        sizes, strides = self.shape(meta), self.strides(meta)
        compact = Layout.contiguous(sizes).strides
        for n, have, want in zip(sizes, strides, compact, strict=True):
            if n != 1 and sympy.expand(sympy.sympify(have) - sympy.sympify(want)) != 0:
                raise Fallback(
                    f"output {node.name} has strides {strides} in eager, not compact {compact}"
                )

    def extern(self, node: torch.fx.Node, args: Any, kwargs: Any, target: Any = None) -> Any:
        """Run ``node`` with its aten kernel (or ``target``'s, which must return what the
        node does); its results become extern buffers."""
        refs = pytree.tree_map_only(Value, self._extern_arg(node), (args, kwargs))
        meta = node.meta.get("val")
        leaves, spec = pytree.tree_flatten(meta)
        if not all(isinstance(m, torch.Tensor | type(None)) for m in leaves):
            raise Fallback(f"{node.target} returns {type(meta).__name__}")
        results: list[Value | None] = []
        eager_strides = self.sv is None or _eager_inputs(self, node)
        for m in leaves:
            if m is None:
                results.append(None)
                continue
            layout = Layout(self.shape(m), self.strides(m))
            if self.sv is not None and not (eager_strides and _plain_strides(layout)):
                # an input realized compact where eager's is not: the result's strides may
                # differ from its fake value's too; compact, and the wrapper copies it if not
                layout = Layout.contiguous(layout.sizes)
            buf = self.new_buffer(m.dtype, layout)
            results.append(self.buffer_value(buf))
        names = tuple(v.ref.name for v in results if v is not None and v.ref is not None)
        self.nodes.append(Extern(names, target or node.target, *refs))
        return pytree.tree_unflatten(results, spec)

    def _extern_arg(self, node: torch.fx.Node) -> Callable[[Value], Ref]:
        fx_args = {id(self.values[a]): a for a in node.all_input_nodes if a in self.values}

        def to_ref(value: Value) -> Ref:
            source = fx_args.get(id(value))
            return self.realize(value, self._strides(_dense_strides, source))

        return to_ref

    def _strides(self, rule: Callable[[Any], Any], node: torch.fx.Node | None) -> Any:
        """The strides ``rule`` picks for realizing ``node``'s value. In a symbolic graph:
        eager's strides when they are proved dense in some order of the dims (a transposed
        result), else compact (None); read as expressions, so no guard is added."""
        if node is None:
            return None
        if self.sv is not None:
            meta = node.meta.get("val")
            if not isinstance(meta, torch.Tensor):
                return None
            sizes, strides = self.shape(meta), self.strides(meta)
            return _symbolic_strides(sizes, strides, self.sv.hints, gaps=rule is _output_strides)
        return rule(node.meta.get("val"))


def _eager_inputs(ctx: Lowerer, node: torch.fx.Node) -> bool:
    """Every tensor ``node`` reads is realized with its fake value's sizes and strides, so
    an extern computing it returns the strides its fake value shows (a symbolic graph's
    ``split`` returns windows of its input, which kernels then read in place). The
    wrapper still checks them at run time, so a wrong guess costs a copy, never a value."""
    for arg in node.all_input_nodes:
        meta, value = arg.meta.get("val"), ctx.values.get(arg)
        if not isinstance(meta, torch.Tensor) or not isinstance(value, Value):
            continue
        ref = value.ref or ctx._realized.get(id(value), (None, None))[1]
        if ref is None:
            return False
        have = ref.layout or ctx.buffers[ref.name].layout
        if (have.sizes, have.strides) != (ctx.shape(meta), ctx.strides(meta)):
            return False
    return True


def _plain_strides(layout: Layout) -> bool:
    """No dimension of more than one element has stride 0 (an expanded result)."""
    return all(n == 1 or st != 0 for n, st in zip(layout.sizes, layout.strides, strict=True))


def size_const(n: Any, dtype: torch.dtype) -> Expr:
    """The count ``n`` (an int, or a symbolic size) as a ``dtype`` body leaf: a constant, or
    the size computed from the kernel's size arguments and converted as eager converts it.

    >>> str(size_const(4, torch.float32)), str(size_const(sympy.Symbol("ks0"), torch.float32))
    ('4.0', 'CAST.float32((ks0))')
    """
    if isinstance(n, int | float):
        return const(float(n) if dtype.is_floating_point else int(n), dtype)
    return Expr(Op.CAST, dtype, (Expr(Op.INDEX, torch.int64, (), n),))


def _fetch(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _extremum(target: Any) -> Any:
    """``max`` or ``min`` if ``target`` computes that of numbers, else None."""
    if target in (max, min):
        return target
    if target in (torch.sym_max, torch.sym_min):
        return max if target is torch.sym_max else min
    if getattr(target, "__module__", None) == "ember.aotgraph.numbers":
        from ember.aotgraph.numbers import PLAIN_RULES  # loaded already: the graph calls it

        if target in (PLAIN_RULES[torch.sym_max], PLAIN_RULES[torch.sym_min]):
            return max if target is PLAIN_RULES[torch.sym_max] else min
    return None


def _flatten_extremum(
    node: torch.fx.Node, args: Sequence[Any], ops: list[ScalarOp]
) -> tuple[Any, Sequence[Any]]:
    """``max(max(a, b), c)`` on floats as ``max(a, b, c)``: one call for the 64 numbers of a
    ``tolist()`` rather than 63 (the inner max is then dead, unless something else reads it)."""
    kind = _extremum(node.target)
    floats = all(
        isinstance(a, float) or (isinstance(a, Scalar) and a.dtype == torch.float64) for a in args
    )
    if kind is None or len(args) < 2 or not floats:
        return node.target, args
    made = {op.out.name: op for op in ops}
    flat: list[Any] = []
    for a, fx_arg in zip(args, node.args, strict=True):
        inner = made.get(a.name) if isinstance(a, Scalar) else None
        alone = isinstance(fx_arg, torch.fx.Node) and len(fx_arg.users) == 1
        flat.extend(inner.args if inner is not None and inner.target is kind and alone else [a])
    return kind, flat


def _number_dtype(value: Any) -> torch.dtype | None:
    """How a kernel receives the number ``value`` (plain or symbolic), or None: no number."""
    if isinstance(value, bool | torch.SymBool):
        return torch.bool
    if isinstance(value, int | torch.SymInt):
        return torch.int64
    if isinstance(value, float | torch.SymFloat):
        return torch.float64
    return None


_CPU = torch.device("cpu")


def _plain_meta(meta: Any, symbolic: bool = False, device: torch.device = _CPU) -> bool:
    """Lowerings handle dense-or-view tensors on the graph's ``device`` of ordinary dtypes
    only, of static sizes unless the graph is ``symbolic``."""
    leaves = pytree.tree_leaves(meta)
    return all(
        isinstance(m, torch.Tensor)
        and m.device == device
        and m.dtype in DTYPES
        and not m.is_sparse
        and (symbolic or all(isinstance(s, int) for s in m.shape))
        for m in leaves
    ) and bool(leaves)


# Lowerings checked on symbolic sizes (tests/test_symbolic.py); any other op whose operands
# or result have a symbolic size runs as its aten op. Names are aten packet names.
SYMBOLIC_OPS = frozenset(
    """abs add sub rsub mul div neg exp log log1p expm1 sqrt rsqrt reciprocal sin cos tanh
    sigmoid erf pow maximum minimum relu where clamp clamp_min clamp_max eq ne lt le gt ge
    logical_not logical_and logical_or bitwise_not bitwise_and bitwise_or bitwise_xor sign
    _to_copy convert_element_type
    sum amax amin mean permute t transpose expand view _unsafe_view reshape unsqueeze squeeze
    alias detach broadcast_in_dim full full_like zeros_like ones_like fill scalar_tensor clone copy
    slice select cat constant_pad_nd arange embedding index_select index addmm
    var where_ threshold_backward isnan gelu silu""".split()
)


def _symbolic_ok(node: torch.fx.Node, args: Any, kwargs: Any) -> bool:
    """Whether ``node`` may use its lowering in a symbolic graph: a checked op, or one whose
    operands and result all have static sizes."""
    name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")
    if name in SYMBOLIC_OPS:
        return True
    sizes = [v.sizes for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, Value)]
    leaves = pytree.tree_leaves((args, kwargs))
    numbers = [a for a in leaves if isinstance(a, sympy.Basic | FloatSize)]
    metas = [m for m in pytree.tree_leaves(node.meta.get("val")) if isinstance(m, torch.Tensor)]
    static_out = all(isinstance(n, int) for m in metas for n in m.shape)
    return not numbers and all(is_static(s) for s in sizes) and static_out


# nodes reading a tensor's sizes only (symbolic graphs): the tensor need not be realized
SIZE_READS = frozenset(
    {
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_storage_offset.default,
    }
)

DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool}
    | {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
)


def _output_strides(meta: Any) -> tuple[int, ...] | None:
    """Eager's strides for an output like ``meta``: its own when no two elements share
    memory, gaps allowed (``(b + c).narrow(-1, 1, 2)`` is a window of a wider tensor in
    eager, strides ``(3, 1)``: a buffer laid out so keeps them); else None (compact).

    >>> _output_strides(torch.empty(4, 3).narrow(-1, 1, 2))
    (3, 1)
    >>> _output_strides(torch.empty(3).expand(2, 3)) is None
    True
    """
    if not isinstance(meta, torch.Tensor) or meta.numel() == 0:
        return None
    dims = sorted((st, n) for n, st in zip(meta.shape, meta.stride(), strict=True) if n > 1)
    span = 0  # the farthest element the dimensions so far reach (sufficient, not exact)
    for stride, n in dims:
        if stride <= span:
            return None  # may overlap (an expanded dimension): no such layout to keep
        span += (n - 1) * stride
    return tuple(meta.stride())


def _symbolic_strides(
    sizes: tuple[Any, ...], strides: tuple[Any, ...], hints: dict[Any, int], gaps: bool
) -> tuple[Any, ...] | None:
    """``strides`` (a fake value's, symbolic) if, in the order the example sizes give, each
    is the product of the sizes inside it (equal as expressions: dense for every size) or,
    with ``gaps``, at least the reach of those inside it (proved for every size >= 2, as
    :func:`size_vars` binds them: a window of a wider tensor, as :func:`_output_strides`);
    else None (compact).

    >>> k = sympy.Symbol("ks0", integer=True, positive=True)
    >>> _symbolic_strides((k, 4), (1, k), {k: 8}, gaps=False)  # a transpose: dense
    (1, ks0)
    >>> _symbolic_strides((k, 4), (8, 1), {k: 8}, gaps=False) is None  # a window
    True
    """
    order = sorted(range(len(sizes)), key=lambda d: (hint(strides[d], hints), -d))
    dense, reach = True, sympy.Integer(0)  # reach: the farthest element the dims so far
    for d in order:
        if sizes[d] == 1:
            continue
        stride = sympy.sympify(strides[d])
        dense = dense and sympy.expand(stride - reach - 1) == 0
        if not (dense or (gaps and nonnegative(stride - reach - 1, least=2))):
            return None
        reach = reach + (sizes[d] - 1) * stride
    compact = Layout.contiguous(sizes).strides
    return None if tuple(strides) == tuple(compact) else tuple(strides)


def _dense_strides(meta: Any) -> tuple[int, ...] | None:
    """Eager's strides for a fresh tensor like ``meta`` when they are dense, else None."""
    if isinstance(meta, torch.Tensor) and is_non_overlapping_and_dense(meta):
        return tuple(meta.stride())
    return None


def lower_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fused_random: bool = False,
    printer: str = "cpp",
) -> Program:
    """Lower an aten-level graph whose nodes carry ``meta['val']`` to a :class:`Program`.

    ``fused_random``: lower random ops to counter-based numbers computed in the kernels
    (:mod:`ember.inductor.lower_random`); by default they run torch's kernels. ``printer``:
    the code printer that will take the program, ``"cpp"`` or ``"triton"``."""
    from ember.inductor import (  # noqa: F401
        lower_alone,
        lower_ops,
        lower_pow,
        lower_random,
        lower_views,
    )

    sv = size_vars(gm, example_inputs)
    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    device = devices.pop() if len(devices) == 1 else None  # (CUDA inputs: Triton kernels)
    lowerer = Lowerer(fused_random=fused_random, sv=sv, device=device, printer=printer)
    return lowerer.lower(gm, example_inputs)
