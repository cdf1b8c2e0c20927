"""Tracing: a graph module -> a functional aten-level joint (or forward-only) graph.

The passes, in order (:func:`trace_joint` and :func:`trace_forward` run them):

1. :class:`Lifted`: parameters and buffers of the module become trailing inputs;
   float inputs stay inputs (traced as symbolic floats), other non-tensors are constants.
2. :func:`analyze`: one run on fake tensors finds which outputs need gradients, which
   alias inputs (handed back as views at run time, not computed) and which are constants.
3. ``make_fx`` with the decomposition table traces the joint function
   ``(primals, tangents) -> (outputs, input gradients)``: autograd runs during
   tracing, so the backward formulas land in the graph as aten ops.
4. :func:`out_of_place` rewrites in-place ops on fresh intermediates (autograd's
   gradient accumulation) as their twins; if a mutation is left, ``make_fx`` over
   ``torch.func.functionalize`` retraces the graph without mutations: in-place ops
   become out-of-place ones, and writes to inputs become ``copy_`` nodes at the end.
5. :func:`lift_mutations` turns those ``copy_`` nodes into extra forward outputs
   the runtime writes back; :func:`strip_detach` and dead-code elimination tidy up.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x, w: (x @ w).relu())
>>> x, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
>>> lifted = Lifted.of(gm, [x, w])
>>> joint = trace_joint(lifted, [x, w], analyze(lifted, [x, w], grad=True), {})
>>> print(joint.gm.code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, primals_1, primals_2, tangents_1):
    mm = torch.ops.aten.mm.default(primals_1, primals_2);  primals_2 = None
    relu = torch.ops.aten.relu.default(mm);  mm = None
    threshold_backward = torch.ops.aten.threshold_backward.default(tangents_1, relu, 0);  ...
    t = torch.ops.aten.t.default(primals_1);  primals_1 = None
    mm_1 = torch.ops.aten.mm.default(t, threshold_backward);  t = threshold_backward = None
    return [relu, mm_1]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._guards import GuardSource, SLoc, Source
from torch._subclasses import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from ember.aotgraph import nodemeta, opmemo, symbolic
from ember.aotgraph.aliasing import storage_groups, unwritten_sharing, viewed_input
from ember.aotgraph.cleanup import eliminate_common_subexpressions, lift_mutations, strip_detach
from ember.aotgraph.eager_checks import (
    EagerOnly,
    Unsupported,
    check_mutations,
    check_operand_dtypes,
)
from ember.aotgraph.inputfakes import input_fake
from ember.aotgraph.numbers import plain_numbers, symbolic_numbers
from ember.aotgraph.rng_order import draw_in_memory_order
from ember.aotgraph.signature import Output, Signature, TensorMeta, _offset
from ember.aotgraph.symbolic import GraphSymbols, graph_symbols, is_symbolic

__all__ = [
    "JointGraph",
    "Lifted",
    "Output",
    "Signature",
    "Specialized",
    "TensorMeta",
    "analyze",
    "trace_forward",
    "trace_joint",
]

aten = torch.ops.aten
Table = dict[Any, Callable[..., Any]]


@dataclass(frozen=True, slots=True)
class Lifted:
    """A graph module as a function of flat tensors: its tensor inputs, then its parameters.

    Graphs from ember's capture already take parameters as inputs and lift nothing;
    ``torch.fx.symbolic_trace(module)`` keeps them as attributes, which are lifted
    here so that gradients reach them and buffer updates are written back.

    >>> lin = torch.fx.symbolic_trace(torch.nn.Linear(3, 4))
    >>> lifted = Lifted.of(lin, [torch.zeros(2, 3)])
    >>> lifted.names, len(lifted.state())
    (('weight', 'bias'), 2)
    """

    module: Callable[..., Any]
    names: tuple[str, ...]  # parameter and buffer names, lifted to trailing inputs
    owners: tuple[tuple[Any, str], ...]  # (submodule, attribute) holding each name
    template: tuple[Any, ...]  # the example inputs; constants are baked in from here
    input_positions: tuple[int, ...]  # which example inputs are graph inputs (tensors, floats)
    constant_positions: tuple[int, ...]  # which are not: compiled in for their values
    floats: bool  # whether float inputs are graph inputs (symbolic) or constants
    # the graph's own fake mode and placeholder values, when its sizes are symbolic: then
    # its SymInt placeholders are graph inputs too, and floats are constants
    symbols: GraphSymbols | None = None

    @staticmethod
    def of(
        module: Callable[..., Any], example_inputs: Sequence[Any], *, floats: bool = True
    ) -> Lifted:
        found = graph_symbols(module)
        floats = floats and found is None
        ints = (
            {i for i, v in enumerate(found.values) if isinstance(v, torch.SymInt)} if found else ()
        )
        positions = tuple(
            i
            for i, a in enumerate(example_inputs)
            if isinstance(a, torch.Tensor) or (floats and type(a) is float) or i in ints
        )
        others = tuple(i for i in range(len(example_inputs)) if i not in positions)
        floats = any(type(example_inputs[i]) is float for i in positions)
        if floats and isinstance(module, torch.fx.GraphModule):
            module = symbolic_numbers(module)
        names: tuple[str, ...] = ()
        owners: list[tuple[Any, str]] = []
        if isinstance(module, torch.nn.Module):
            params = [n for n, _ in module.named_parameters()]
            names = (*params, *(n for n, _ in module.named_buffers()))
            for name in names:
                path, _, attr = name.rpartition(".")
                owners.append((module.get_submodule(path), attr))
        template = tuple(example_inputs)
        return Lifted(module, names, tuple(owners), template, positions, others, floats, found)

    def specialized(self) -> Lifted:
        """The same function with its float inputs compiled in as constants.

        >>> gm = torch.fx.symbolic_trace(lambda x, k: x * k)
        >>> Lifted.of(gm, [torch.ones(1), 2.0]).specialized().constant_positions
        (1,)
        """
        return Lifted.of(self.module, self.template, floats=False)

    def constants_match(self, args: Sequence[Any]) -> bool:
        """Whether the constant inputs of a call are the ones this was traced with.

        >>> lifted = Lifted.of(torch.fx.symbolic_trace(lambda x, k: x * k), [torch.ones(1), 2])
        >>> match = lifted.constants_match
        >>> match([torch.ones(1), 2]), match([torch.ones(1), 3])
        (True, False)
        """
        template = self.template
        for i in self.constant_positions:
            a, b = args[i], template[i]
            if not (a is b or (type(a) is type(b) and a == b)):
                return False
        return True

    def state(self) -> list[torch.Tensor]:
        """The module's current parameters and buffers, in ``names`` order."""
        return [getattr(owner, attr) for owner, attr in self.owners]

    def flat_inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """The graph's tensor inputs for a call with ``args``."""
        if not self.owners and len(self.input_positions) == len(args):
            return list(args)
        return [args[i] for i in self.input_positions] + self.state()

    def __call__(self, *tensors: torch.Tensor) -> Any:
        n = len(self.input_positions)
        args = list(self.template)
        for pos, t in zip(self.input_positions, tensors[:n], strict=True):
            args[pos] = t
        return nodemeta.call_module(self.module, args, self.names, tensors[n:])


class Specialized(Exception):
    """Tracing needed the value of a float input (``math.sqrt(k)``, ``if k > 0``): compile
    the function again with its floats as constants."""


@dataclass(frozen=True)
class _FloatInput(Source):
    """Names a float graph input for the shape environment's symbols."""

    index: int

    @functools.cached_property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL

    @property
    def _name_template(self) -> str:
        return f"input{self.index}"


class QuietShapeEnv(ShapeEnv):
    """A ``ShapeEnv`` that does not look for the user's source line of each symbol and guard.

    torch's finds it by walking the stack past a list of framework files, and building
    that list the first time imports a large part of torch's own compiler stack: 0.4 s
    of the first compile with float inputs in each process. ember names its symbols
    after graph inputs, so the location adds nothing.

    >>> QuietShapeEnv()._get_stack_summary()[0].framework_loc
    'ember.aotgraph'
    """

    def _get_stack_summary(
        self, is_debug: bool = False, framework_loc: str | None = None
    ) -> tuple[SLoc, str]:
        return SLoc(framework_loc or "ember.aotgraph", None), ""


def _fake_mode(inputs: Sequence[Any]) -> FakeTensorMode:
    """The mode to trace ``inputs`` in: that of fake inputs with symbolic sizes (the graph's
    own, see :mod:`ember.aotgraph.symbolic`), else a new one with static shapes."""
    for value in inputs:
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=QuietShapeEnv(), static_shapes=True)


def _fakes(mode: FakeTensorMode, inputs: Sequence[Any]) -> list[Any]:
    """Fake tensors for tensors; for floats, symbolic floats with the value as hint.
    A fake input (symbolic shapes) gets a new fake with its layout and ``requires_grad``,
    so that a trace's in-place ops do not change it for the next trace; a SymInt stays."""
    out: list[Any] = []
    env = mode.shape_env
    assert env is not None
    for i, value in enumerate(inputs):
        if isinstance(value, FakeTensor):
            out.append(_refake(mode, value))
        elif isinstance(value, torch.Tensor):
            out.append(_own_fake(mode, value))
        elif isinstance(value, torch.SymInt):
            out.append(value)
        else:
            out.append(symbolic_float(env, value, i))
    return out


def _own_fake(mode: FakeTensorMode, real: torch.Tensor) -> torch.Tensor:
    """The fake of the real tensor ``real`` in ``mode``, which ``make_fx`` takes as it is.

    ``make_fx`` converts each argument with the fake mode it finds among them, and of a fake
    that mode made from a real tensor it makes another fake (its converter memoizes by the
    tensor converted): every parameter was made a fake twice here (0.09 ms each, 12 a
    hf-gpt2 layer). Noted as its own fake, the same one is handed on. Only with static
    shapes: a symbolic trace's conversion is the one that gives its inputs their symbols.

    >>> mode = _fake_mode([torch.ones(2)])
    >>> fake = _own_fake(mode, torch.ones(2))
    >>> mode.from_tensor(fake) is fake
    True
    """
    if mode.static_shapes:  # a plain tensor made a fake directly (inputfakes)
        return _handed_on(mode, input_fake(mode, real))
    return mode.from_tensor(real)


def _handed_on(mode: FakeTensorMode, fake: torch.Tensor) -> torch.Tensor:
    """``fake``, noted as its own fake in ``mode`` (static shapes): see :func:`_own_fake`."""
    if mode.static_shapes and isinstance(fake, FakeTensor):
        mode.fake_tensor_converter.set_tensor_memo(fake, fake)
    return fake


def _refake(mode: FakeTensorMode, t: FakeTensor) -> torch.Tensor:
    with mode:
        new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return new.requires_grad_() if t.requires_grad else new


def symbolic_float(env: ShapeEnv, value: float, index: int) -> torch.SymFloat | float:
    """A symbolic float of ``env`` named ``input<index>``, with ``value`` as its hint.

    >>> x = symbolic_float(ShapeEnv(), 2.5, 0)
    >>> type(x * 2).__name__, (x * 2).node.hint
    ('SymFloat', 5.0)
    """
    source = _FloatInput(index)
    sym = env.create_unspecified_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
    return env.create_symfloatnode(sym, hint=value, source=source)


def _unspecialized(mode: FakeTensorMode) -> None:
    """Raise :class:`Specialized` if tracing guarded on a float input's value."""
    env = mode.shape_env  # only ember's own: a graph's ShapeEnv has guards on sizes
    if isinstance(env, QuietShapeEnv) and (env.guards or env.replacements):
        raise Specialized(f"tracing needed the value of a float input: {env.guards}")


def _classify(leaf: Any, fakes: list[Any], graph_index: int, grad: bool) -> Output:
    if isinstance(leaf, torch.SymFloat | torch.SymInt | torch.SymBool):
        return Output("graph", graph_index)  # computed from float inputs: the graph returns it
    if not isinstance(leaf, torch.Tensor):
        return Output("constant", value=leaf)
    for i, f in enumerate(fakes):
        if leaf is f:
            return Output("input", i)
    storage = leaf.untyped_storage()._cdata
    sharing = [
        i
        for i, f in enumerate(fakes)
        if isinstance(f, torch.Tensor) and f.untyped_storage()._cdata == storage
    ]
    if sharing:
        i = viewed_input(leaf, fakes, sharing, grad)
        f = fakes[i]
        if leaf.dtype != f.dtype:  # the runtime rebuilds aliases with as_strided
            raise EagerOnly(f"an output is a {leaf.dtype} view of a {f.dtype} input")
        if grad and leaf.requires_grad and leaf.grad_fn is None:
            # made under no_grad: it requires grad but has no history, which a view
            # rebuilt with autograd on (as_strided) cannot be; eager decides its rules
            raise EagerOnly("an output is a view of an input made under no_grad")
        # requires_grad: whether the view records autograd history (``x.detach()``
        # does not), so that the runtime's rebuilt view does not either
        # offset relative to the input's: the next call's input may sit elsewhere in
        # its storage (``c = a[1]`` then a fresh ``c``); guards fix its strides
        meta = TensorMeta.of(leaf)
        meta = replace(meta, offset=meta.offset - _offset(f))
        made = _creation(leaf)
        return Output("alias", i, leaf.requires_grad, meta=meta, creation=made)
    grad = leaf.requires_grad and (leaf.is_floating_point() or leaf.is_complex())
    made = _creation(leaf)  # eager refuses in-place writes to it too
    view = leaf._is_view()
    return Output("graph", graph_index, grad, TensorMeta.of(leaf), creation=made, view=view)


_REFUSED = ("MULTI_OUTPUT_NODE", "NO_GRAD_MODE")  # creations autograd refuses to write


def _creation(t: torch.Tensor) -> str:
    """How the view ``t`` was made, if autograd refuses in-place writes to it: by an op that
    returns several (chunk, split, unbind), or under no_grad from a tensor requiring grad."""
    if not t._is_view():
        return ""
    name = torch._C._autograd._get_creation_meta(t).name
    return name if name in _REFUSED else ""


def _outputs(leaves: list[Any], fakes: list[Any], grad: bool) -> tuple[list[Output], list[int]]:
    """Each flat output classified, and the positions of those the graph returns.

    An output that is a view of another graph output is no graph output itself: the
    runtime makes it from that output outside the ``autograd.Function``, as eager's view
    of it. (Returned from the Function, autograd would take it for one of several views
    its node made, and refuse an in-place write to it after a graph break.)
    """
    outputs, first = [], dict[int, int]()  # a tensor returned twice is one object in eager
    for pos, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and id(leaf) in first:
            outputs.append(Output("same", first[id(leaf)]))
            continue
        first.setdefault(id(leaf), pos)
        outputs.append(_classify(leaf, fakes, -1, grad))
    bases = {id(leaf): j for j, leaf in enumerate(leaves) if outputs[j].kind == "graph"}
    positions: list[int] = []
    for pos, (leaf, out) in enumerate(zip(leaves, outputs, strict=True)):
        if out.kind == "graph" and id(getattr(leaf, "_base", None)) not in bases:
            positions.append(pos)
    index = {pos: k for k, pos in enumerate(positions)}
    for pos, (leaf, out) in enumerate(zip(leaves, outputs, strict=True)):
        if pos in index:
            outputs[pos] = replace(out, index=index[pos])
        elif out.kind == "graph":  # a view of graph output ``base``
            base = bases[id(leaf._base)]
            meta = TensorMeta.of(leaf)
            meta = replace(meta, offset=meta.offset - _offset(leaf._base))
            made = _creation(leaf)
            outputs[pos] = Output("view", index[base], leaf.requires_grad, meta=meta, creation=made)
    return outputs, positions


def analyze(fn: Lifted, inputs: Sequence[torch.Tensor], *, grad: bool) -> Signature:
    """Run ``fn`` once on fake copies of ``inputs`` and describe its outputs.

    >>> gm = torch.fx.symbolic_trace(lambda x, y: (x.t(), x * y, 3))
    >>> x = torch.randn(2, 3, requires_grad=True)
    >>> sig = analyze(Lifted.of(gm, [x, x]), [x, x], grad=True)
    >>> [(o.kind, o.index, o.requires_grad) for o in sig.outputs]
    [('alias', 0, True), ('graph', 0, True), ('constant', -1, False)]
    """
    mode = _fake_mode(inputs)
    fakes = _fakes(mode, inputs)
    seen = Observed.start(fakes)
    with mode, torch.set_grad_enabled(grad):
        seen.after(fn(*fakes))
    _unspecialized(mode)
    return seen.signature(inputs, grad=grad)


@dataclass
class Observed:
    """One run of the function on fakes as :func:`analyze` watches it: the inputs' state
    before, the outputs after; :meth:`signature` describes them."""

    fakes: Sequence[Any]
    before: list[int]  # version counters
    keys: list[Any]  # layouts (restrided inputs)
    wanted: list[bool]  # requires_grad
    leaves: list[Any] | None = None
    spec: pytree.TreeSpec | None = None

    @staticmethod
    def start(fakes: Sequence[Any]) -> Observed:
        return Observed(
            fakes, [_version(f) for f in fakes], [_key(f) for f in fakes],
            [_requires_grad(f) for f in fakes],
        )  # fmt: skip

    def after(self, out: Any) -> list[Any]:
        """Note the function's result ``out``; its flat leaves."""
        self.leaves, self.spec = pytree.tree_flatten(out)
        return self.leaves

    def signature(self, inputs: Sequence[Any], *, grad: bool) -> Signature:
        """The :class:`Signature` of the run (``inputs``: the real or fake inputs)."""
        fakes, wanted, leaves = self.fakes, self.wanted, self.leaves
        assert leaves is not None and self.spec is not None
        changed = [i for i, f in enumerate(fakes) if _requires_grad(f) != wanted[i]]
        if any(wanted[i] for i in changed):  # requires_grad_(False): nothing to replay it with
            raise Unsupported(
                f"aot_compile: the function calls requires_grad_(False) on input {changed[0]}; "
                "run this function eagerly"
            )
        versions = tuple(_version(f) - v for f, v in zip(fakes, self.before, strict=True))
        keys = self.keys
        restrided = tuple((i, _meta(f)) for i, f in enumerate(fakes) if _key(f) != keys[i])
        outputs, positions = _outputs(leaves, list(fakes), grad)
        grad_outputs = tuple(o.index for o in outputs if o.kind == "graph" and o.requires_grad)
        grad_inputs = tuple(i for i, t in enumerate(inputs) if _requires_grad(t) or i in changed)
        grad_inputs = grad_inputs if grad else ()
        training = bool(grad_outputs) and bool(grad_inputs)
        shared = storage_groups([leaves[p] for p in positions])  # eager's outputs share these
        return Signature(
            tuple(outputs), self.spec, tuple(positions), grad_outputs, grad_inputs, training,
            versions, shared, tuple((i, m) for i, m in restrided if m is not None),
            grad_set=tuple(changed),
        )  # fmt: skip


def _meta(value: Any) -> TensorMeta | None:
    return TensorMeta.of(value) if isinstance(value, torch.Tensor) else None


def _key(value: Any) -> Any:
    meta = _meta(value)
    return meta.key() if meta is not None else None


def _version(value: Any) -> int:
    """A tensor's version counter (0 for a number or an inference tensor, which has none)."""
    if not isinstance(value, torch.Tensor) or value.is_inference():
        return 0
    return int(value._version)


def _requires_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


@dataclass(frozen=True, slots=True)
class JointGraph:
    """A functional aten graph ``(*primals, *tangents) -> [*outputs, *mutations, *grads]``.

    With ``num_tangents == num_grads == 0`` it is a forward-only (inference) graph.
    ``mutations`` are the new values of the tensor inputs listed in ``mutated``,
    which the runtime copies back into the caller's tensors.

    >>> def f(x, buf):
    ...     buf.add_(1)
    ...     return x * buf
    >>> x, buf = torch.randn(3, requires_grad=True), torch.zeros(3)
    >>> lifted = Lifted.of(torch.fx.symbolic_trace(f), [x, buf])
    >>> joint = trace_joint(lifted, [x, buf], analyze(lifted, [x, buf], grad=True), {})
    >>> joint.num_primals, joint.num_tangents, joint.num_outputs, joint.mutated, joint.num_grads
    (2, 1, 1, (1,), 1)
    >>> print(joint.gm.code.strip())  # doctest: +NORMALIZE_WHITESPACE
    def forward(self, primals_1, primals_2, tangents_1):
        add = torch.ops.aten.add.Tensor(primals_2, 1);  primals_2 = None
        mul = torch.ops.aten.mul.Tensor(primals_1, add);  primals_1 = None
        mul_1 = torch.ops.aten.mul.Tensor(tangents_1, add);  tangents_1 = None
        return [mul, add, mul_1]
    """

    gm: torch.fx.GraphModule
    num_primals: int
    num_tangents: int
    num_outputs: int  # graph outputs the caller sees (Signature.graph_outputs)
    mutated: tuple[int, ...]  # primal indices written back, in output order
    num_grads: int  # one per Signature.grad_inputs entry (None where unused)

    @property
    def num_forward_outputs(self) -> int:
        """Outputs the forward graph returns before any saved values."""
        return self.num_outputs + len(self.mutated)


def _graph_outputs(fn: Callable[..., Any], sig: Signature) -> Callable[..., list[torch.Tensor]]:
    def run(*primals: torch.Tensor) -> list[torch.Tensor]:
        with torch.set_grad_enabled(torch.is_grad_enabled()):  # an optimizer step switches it
            leaves = pytree.tree_leaves(fn(*primals))  # (a leaf is written back under ours)
        return [leaves[pos] for pos in sig.graph_outputs]

    return run


def _joint_function(
    fn: Callable[..., Any], sig: Signature, n: int, separate: frozenset[int] = frozenset()
) -> Callable[..., list[Any]]:
    forward = _graph_outputs(fn, sig)

    def joint(*args: torch.Tensor) -> list[Any]:
        primals, tangents = args[:n], args[n:]
        if separate:  # each input its own autograd leaf: see trace_joint
            primals = tuple(_own_leaf(p) if i in separate else p for i, p in enumerate(primals))
        outs = forward(*primals)
        diff = [outs[j] for j in sig.grad_outputs]
        nodemeta.mark_backward(diff)  # nodes of the formulas: tagged, with their forward's meta
        wrt = [primals[i] for i in sig.grad_inputs]
        grads = torch.autograd.grad(diff, wrt, list(tangents), allow_unused=True)
        return [*outs, *grads]

    return joint


def _tangents(mode: FakeTensorMode, sig: Signature, inputs: Sequence[Any]) -> list[torch.Tensor]:
    metas = {o.index: o.meta for o in sig.outputs if o.kind == "graph"}
    first = len(sig.graph_outputs) - len(sig.replaced)
    for k, i in enumerate(sig.replaced):  # the final value of a replaced input: its shape
        metas[first + k] = TensorMeta.of(inputs[i])
    out = []
    with mode:
        for j in sig.grad_outputs:
            meta = metas[j]
            assert meta is not None
            out.append(torch.empty(meta.size, dtype=meta.dtype, device=meta.device))
    return [_handed_on(mode, t) for t in out]


def _trace(f: Callable[..., Any], args: list[torch.Tensor], table: Table) -> torch.fx.GraphModule:
    """make_fx then make_fx over functionalize: aten ops, no mutations (passes 3 and 4).

    The second trace is skipped when the first graph mutates nothing (no op with a
    mutable schema): functionalization would give the same graph back.
    """
    # symbolic sizes: traced as sym_size nodes and SymInt arguments, not as numbers
    mode: Literal["symbolic", "fake"] = "symbolic" if any(map(is_symbolic, args)) else "fake"
    with nodemeta.code_later():  # its code is generated once, by _finish
        return _trace_lazily(f, args, table, mode)


def _trace_lazily(
    f: Callable[..., Any], args: list[torch.Tensor], table: Table, mode: Literal["symbolic", "fake"]
) -> torch.fx.GraphModule:
    aten_gm = symbolic.make_fx(f, table, mode)(*args)  # nodes keep their captured node's meta
    draw_in_memory_order(aten_gm)  # random fills of permuted tensors: eager's numbers
    check_mutations(aten_gm)  # writes eager refuses at run time, which fake tensors allow
    check_operand_dtypes(aten_gm)  # and products of two dtypes, even unused ones
    out_of_place(aten_gm)
    if not any(_mutates(node) for node in aten_gm.graph.nodes):
        return plain_numbers(aten_gm)
    functional = torch.func.functionalize(nodemeta.interpreted(aten_gm), remove="mutations")
    traced = symbolic.make_fx(functional, table, mode, retraces=aten_gm)(*args)
    return plain_numbers(traced)


def _mutates(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def out_of_place(gm: torch.fx.GraphModule) -> None:
    """Rewrite in-place ops on fresh intermediates as their out-of-place twins.

    Autograd accumulates the gradient of a value used twice with ``add_`` on a
    buffer of its own, and RNN cells add their two matmuls in place: without this
    pass one such node forces the second, functionalizing trace (about a quarter of
    rnn-train's cold compile). ``y = a.add_(b)`` becomes ``y = a.add(b)``, and the
    users of ``a`` after it read ``y``, when nothing can observe the difference:
    ``a`` comes from an op returning a fresh tensor, no op made a view of it, and
    the twin computes the same dtype, shape and strides (checked on the fake
    values). Anything else is left for functionalization.

    >>> def f(x):
    ...     a = x * 2
    ...     return a.add_(1).sin() + a
    >>> gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(2))
    >>> out_of_place(gm)
    >>> print(gm.code.strip())  # doctest: +NORMALIZE_WHITESPACE
    def forward(self, x_1):
        mul = torch.ops.aten.mul.Tensor(x_1, 2);  x_1 = None
        add_tensor = torch.ops.aten.add.Tensor(mul, 1);  mul = None
        sin = torch.ops.aten.sin.default(add_tensor)
        add = torch.ops.aten.add.Tensor(sin, add_tensor);  sin = add_tensor = None
        return add
    """
    graph = gm.graph
    order = {node: k for k, node in enumerate(graph.nodes)}
    changed = False
    for node in list(graph.nodes):
        twin = _functional_twin(node)
        if twin is None:
            continue
        a = node.args[0]
        if not (isinstance(a, torch.fx.Node) and _fresh(a) and not _viewed(a)):
            continue
        fakes = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta.get("val"), node.args)
        try:
            value = twin(*fakes, **node.kwargs)
        except Exception:
            continue
        have: torch.Tensor = a.meta["val"]  # a tensor: _fresh checked
        same = isinstance(value, torch.Tensor) and (value.dtype, value.shape, value.stride()) == (
            have.dtype,
            have.shape,
            have.stride(),
        )
        if not same:
            continue
        with graph.inserting_before(node):
            new = graph.call_function(twin, node.args, node.kwargs)
        new.meta = {**node.meta, "val": value}
        for user in list(a.users):
            if user is not node and user in order and order[user] > order[node]:
                user.replace_input_with(a, new)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        order[new] = order[node]
        changed = True
    if changed:
        gm.recompile()


def _functional_twin(node: torch.fx.Node) -> Any:
    """``aten.add.Tensor`` for an ``aten.add_.Tensor`` node that writes its first argument
    only; None for any other node."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable):
        return None
    schema = target._schema
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(writes) != 1 or writes[0] is not schema.arguments[0] or node.kwargs.get("out"):
        return None
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    twin = getattr(packet, target._overloadname, None) if packet is not None else None
    if twin is None or twin._schema.is_mutable:
        return None
    return twin


def _fresh(node: torch.fx.Node) -> bool:
    """``node`` is a tensor made by an op that returns new memory (no alias, no mutation)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    fresh = not schema.is_mutable and all(r.alias_info is None for r in schema.returns)
    return fresh and isinstance(node.meta.get("val"), torch.Tensor)


def _viewed(node: torch.fx.Node) -> bool:
    """An op other than an in-place one on ``node`` returns memory shared with it."""
    for user in node.users:
        target = user.target
        if not isinstance(target, torch._ops.OpOverload):
            return True  # getitem, a Python call: cannot tell
        if _functional_twin(user) is not None and user.args[0] is node:
            continue
        if target._schema.is_mutable or any(r.alias_info for r in target._schema.returns):
            return True
    return False


def _own_leaf(value: Any) -> Any:
    """``value`` cut from the autograd history of the tensor it is a view of."""
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return value
    return value.detach().requires_grad_()


def trace_joint(
    fn: Callable[..., Any], inputs: Sequence[torch.Tensor], sig: Signature, table: Table
) -> JointGraph:
    """The functional joint forward+backward graph of ``fn`` (see the module docstring)."""
    mode = _fake_mode(inputs)
    primals = _fakes(mode, inputs)
    tangents = _tangents(mode, sig, inputs)
    # Fakes of inputs sharing a storage are views of one fake base, so autograd would pass
    # one input's gradient on to the other (b and b[1:]: b's gradient counted twice); eager's
    # inputs are separate tensors. Written inputs sharing storage are merged or refused; an
    # input written elsewhere does not stop the others being separated (f(a, b, a[1])
    # writing b: a's gradient took c's too).
    separate = unwritten_sharing(primals, sig.versions)
    with torch.enable_grad(), opmemo.if_enabled():  # autograd runs above the memo's level
        joint_fn = _joint_function(fn, sig, len(primals), separate)
        gm = _trace(joint_fn, [*primals, *tangents], table)
    _unspecialized(mode)
    n_outs = len(sig.graph_outputs)
    mutated = _finish(gm, len(primals), n_outs)
    return JointGraph(gm, len(primals), len(tangents), n_outs, mutated, len(sig.grad_inputs))


def trace_forward(
    fn: Callable[..., Any], inputs: Sequence[torch.Tensor], sig: Signature, table: Table
) -> JointGraph:
    """The functional forward-only graph of ``fn``, for inference (no tangents, no grads).

    >>> gm = torch.fx.symbolic_trace(lambda x: x.add_(1).sin())
    >>> x = torch.zeros(2)
    >>> lifted = Lifted.of(gm, [x])
    >>> fw = trace_forward(lifted, [x], analyze(lifted, [x], grad=False), {})
    >>> fw.mutated, fw.gm(torch.zeros(2))
    ((0,), [tensor([0.8415, 0.8415]), tensor([1., 1.])])
    """
    mode = _fake_mode(inputs)
    primals = _fakes(mode, inputs)
    with torch.no_grad(), opmemo.if_enabled():  # repeated layers: each op traced once
        gm = _trace(_graph_outputs(fn, sig), primals, table)
    _unspecialized(mode)
    n_outs = len(sig.graph_outputs)
    mutated = _finish(gm, len(primals), n_outs)
    return JointGraph(gm, len(primals), 0, n_outs, mutated, 0)


def _finish(gm: torch.fx.GraphModule, n_primals: int, n_outs: int) -> tuple[int, ...]:
    """Passes 5: lift input mutations to outputs, drop detaches, CSE, DCE, name placeholders."""
    mutated = lift_mutations(gm, n_outs)  # copy_ into inputs -> extra forward outputs
    strip_detach(gm)  # detach is the identity once autograd is traced away
    eliminate_common_subexpressions(gm)  # one t(w) for a weight used at every step of a loop
    gm.graph.eliminate_dead_code()
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        name = f"primals_{i + 1}" if i < n_primals else f"tangents_{i - n_primals + 1}"
        node.name = node.target = name
    gm.graph.lint()
    nodemeta.generate_code(gm)  # the trace's graph module made none (nodemeta.code_later)
    return mutated
