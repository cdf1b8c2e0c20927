"""Aten-level lowering of an exported program (``run_decompositions``), without ember.capture.

:func:`lower_exported` takes what ``ember.capture.export`` made, as a graph module and
plain data (its signature's JSON, :mod:`ember.aotgraph.program_signature`; its tensors by
name), and traces it with aotgraph's own machinery (:mod:`ember.aotgraph.trace`:
``make_fx`` with the decomposition table, functionalization, mutations lifted to outputs).
The result, an :class:`AtenProgram`, is a graph of functional aten ops whose placeholders
keep the exported names and order, and whose signature says what each output is:

- **inference IR** (default): ``(*inputs) -> (*mutations, *user outputs)``. In-place
  writes to buffers and user inputs become explicit outputs (``buffer_mutation``,
  ``user_input_mutation``) before the user's outputs, as torch's ``ExportedProgram``
  orders them. :meth:`AtenProgram.module` calls it as the original was called and
  writes the mutations back.
- **training IR** (``joint=True``): the joint forward and backward graph
  ``(*inputs, *tangents) -> (*mutations, *user outputs, *gradients)``, autograd traced
  into the graph (aotgraph's ``trace_joint``). ``tangent`` inputs name the output they
  are the cotangent of; ``gradient_to_parameter``/``gradient_to_user_input`` outputs name
  the parameter (FQN) or input (placeholder) they are the gradient of.

A dynamic dimension (a ``Dim`` in the checks) stays dynamic (sizes as ``sym_size``
nodes, :mod:`ember.aotgraph.exported_shapes`); a guard the trace adds on the sizes
becomes a shape relation of the lowered signature, checked on every call. Where that
cannot be (a guard on a float input), the program is lowered at the example's sizes,
the lowered signature's checks say so, and a call with another size is refused.

>>> import torch
>>> def exported(p_weight, b_count, x):  # shaped like ember.capture.export's graphs
...     b_count.add_(1)
...     return (b_count, torch.nn.functional.linear(x, p_weight).relu())
>>> gm = torch.fx.symbolic_trace(exported)
>>> sig = {
...     "inputs": [{"kind": "parameter", "name": "p_weight", "target": "weight"},
...                {"kind": "buffer", "name": "b_count", "target": "count"},
...                {"kind": "user_input", "name": "x", "leaf": 0}],
...     "outputs": [{"kind": "buffer_mutation", "name": "add_", "target": "count"},
...                 {"kind": "user_output", "name": "relu"}],
...     "in_spec": torch.utils._pytree.treespec_dumps(
...         torch.utils._pytree.tree_flatten(((torch.ones(1),), {}))[1]),
...     "out_spec": torch.utils._pytree.treespec_dumps(
...         torch.utils._pytree.tree_flatten(torch.ones(1))[1]),
...     "checks": [{"leaf": 0, "path": "args[0]", "kind": "tensor", "dtype": "torch.float32",
...                 "sizes": [2, 3]}]}
>>> state = {"weight": torch.ones(4, 3), "count": torch.zeros(())}
>>> program = lower_exported(gm, sig, state)
>>> print(program.graph_module.code.strip())  # doctest: +NORMALIZE_WHITESPACE
def forward(self, p_weight, b_count, x):
    add = torch.ops.aten.add.Tensor(b_count, 1);  b_count = None
    t = torch.ops.aten.t.default(p_weight);  p_weight = None
    mm = torch.ops.aten.mm.default(x, t);  x = t = None
    relu = torch.ops.aten.relu.default(mm);  mm = None
    return (add, relu)
>>> [(s.kind, s.name, s.target) for s in program.signature.outputs]
[('buffer_mutation', 'add', 'count'), ('user_output', 'relu', None)]
>>> m = program.module()
>>> m(torch.ones(2, 3))
tensor([[3., 3., 3., 3.],
        [3., 3., 3., 3.]])
>>> m.count
tensor(1.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ember.aotgraph.decompositions import DECOMPOSITIONS, default_decompositions
from ember.aotgraph.eager_checks import EagerOnly, Unsupported
from ember.aotgraph.exported_checks import (
    LoweredModule,
    LoweringError,
    check_call,
    example_leaves,
    static_checks,
)
from ember.aotgraph.exported_shapes import dynamic_dims, symbolic_inputs
from ember.aotgraph.numbers import symbolic_numbers
from ember.aotgraph.onepass import trace_without_grad
from ember.aotgraph.program_signature import IOSpec, ProgramSignature
from ember.aotgraph.trace import Lifted, Specialized, Table, _finish, analyze, trace_joint

__all__ = ["AtenProgram", "LoweredModule", "LoweringError", "lower_exported"]


@dataclass(eq=False)
class AtenProgram:
    """What :func:`lower_exported` returns: a functional aten graph, its signature, its tensors.

    ``joint``: the training IR (forward and backward in one graph, called as
    ``graph_module(*program.inputs(args, kwargs), *tangents)``); else the inference IR,
    which :meth:`module` runs.

    >>> gm = torch.fx.symbolic_trace(lambda x, p_w: (x * p_w).sum())
    >>> sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0},
    ...                   {"kind": "parameter", "name": "p_w", "target": "w"}],
    ...        "outputs": [{"kind": "user_output", "name": "sum_1"}]}
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> joint = lower_exported(gm, sig, {"w": w}, args=(torch.ones(2),), joint=True)
    >>> [(s.kind, s.name, s.target) for s in joint.signature.outputs]
    [('user_output', 'sum_1', None), ('gradient_to_parameter', 'mul_1', 'w')]
    >>> joint.graph_module(*joint.inputs((torch.tensor([3.0, 4.0]),)), torch.tensor(1.0))
    (tensor(11., grad_fn=<SumBackward0>), tensor([3., 4.]))
    """

    graph_module: torch.fx.GraphModule
    signature: ProgramSignature
    state_dict: dict[str, torch.Tensor]  # parameters and buffers by fully qualified name
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    joint: bool = False

    def module(self) -> LoweredModule:
        """A module called as the exported function was, writing mutations back (inference IR)."""
        if self.joint:
            raise LoweringError(
                "a joint (training IR) program takes tangents: call "
                "graph_module(*program.inputs(args, kwargs), *tangents)"
            )
        return LoweredModule(self)

    def inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """The graph's inputs for a call with ``args``/``kwargs`` (checked), tangents left out."""
        leaves = check_call(self.signature, tuple(args), dict(kwargs or {}))
        table = {**self.state_dict, **{f"constant:{k}": v for k, v in self.constants.items()}}
        return [_input_value(spec, leaves, table) for spec in self.signature.inputs
                if spec.kind != "tangent"]  # fmt: skip


def lower_exported(
    graph_module: torch.fx.GraphModule,
    signature: ProgramSignature | Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    constants: Mapping[str, torch.Tensor] | None = None,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    decompositions: Table | None = None,
    joint: bool = False,
) -> AtenProgram:
    """The exported program ``graph_module`` + ``signature`` lowered to functional aten ops.

    ``signature``: a :class:`ProgramSignature` or its JSON (``ExportSignature.to_json()``).
    ``state_dict``/``constants``: the program's tensors by the names its signature gives.
    ``args``/``kwargs``: example inputs; by default zeros made from the signature's checks
    (a dynamic dimension then needs an example). ``decompositions``: the table to trace
    with (default :func:`~ember.aotgraph.default_decompositions`; ember's own entries are
    always added). ``joint``: the training IR (see the module docstring).
    """
    sig = signature if isinstance(signature, ProgramSignature) else _read(signature)
    constants = dict(constants or {})
    _check_placeholders(graph_module, sig)
    leaves = example_leaves(sig, args, kwargs)
    table = {**state_dict, **{f"constant:{k}": v for k, v in constants.items()}}
    inputs = [_input_value(spec, leaves, table) for spec in sig.inputs]
    user = [k for k, s in enumerate(sig.outputs) if s.kind == "user_output"]
    fn = _user_outputs(_lifted(graph_module, inputs), user, len(sig.outputs))
    decomp = dict(default_decompositions() if decompositions is None else decompositions)
    decomp.update(DECOMPOSITIONS)
    lowering = _Lowering(fn, sig, tuple(user), decomp)
    lower = lowering.joint if joint else lowering.inference
    try:
        (gm, outputs, extra_inputs), changed = _lower_shapes(lower, sig, inputs, leaves)
    except (Unsupported, EagerOnly) as e:
        raise LoweringError(str(e)) from None
    new = ProgramSignature((*sig.inputs, *extra_inputs), tuple(outputs), {**sig.extra, **changed})
    state = {s.target: state_dict[s.target] for s in sig.inputs_of("parameter", "buffer")
             if s.target is not None}  # fmt: skip
    return AtenProgram(gm, new, state, constants, joint)


def _lower_shapes(
    lower: Callable[[list[Any]], Lowered],
    sig: ProgramSignature,
    inputs: list[Any],
    leaves: list[Any],
) -> tuple[Lowered, dict[str, Any]]:
    """Lower over symbolic sizes where the signature has Dims (the trace's guards on them
    become relations); else at the example's sizes. Also the signature entries that change."""
    shapes = symbolic_inputs(sig, inputs)
    if shapes is not None:
        try:
            lowered = lower(shapes.values)
            relations = [*sig.extra.get("relations", ()), *shapes.relations(leaves)]
            return lowered, {"dims": dynamic_dims(sig), "relations": relations}
        except Specialized:
            pass  # a guard on a float, or one not checkable: at the example's sizes, below
    try:
        return lower(inputs), {"checks": static_checks(sig, leaves)}
    except Specialized as e:
        raise LoweringError(f"lowering needed the value of a float input: {e}") from None


def _read(data: Mapping[str, Any]) -> ProgramSignature:
    try:
        return ProgramSignature.from_json(data)
    except ValueError as e:
        raise LoweringError(str(e)) from None


def _check_placeholders(gm: torch.fx.GraphModule, sig: ProgramSignature) -> None:
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    want = [s.name for s in sig.inputs]
    if names != want:
        raise LoweringError(f"the signature names inputs {want}, the graph's are {names}")
    if sig.inputs_of("tangent"):
        raise LoweringError("the program is already a joint graph (it takes tangents)")


def _lifted(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Lifted:
    """``gm`` as aotgraph traces a graph: every input a graph input, float inputs symbolic.
    Built directly (not ``Lifted.of``): a dynamic export's placeholders carry capture's
    symbolic fakes, and the lowering makes its own symbols, one per Dim, from the checks."""
    floats = any(type(v) is float for v in inputs)
    module: Callable[..., Any] = symbolic_numbers(gm) if floats else gm
    positions = tuple(range(len(inputs)))
    return Lifted(module, (), (), tuple(inputs), positions, (), floats)


def _user_outputs(fn: Lifted, user: list[int], n: int) -> Callable[..., list[Any]]:
    """The exported graph's user outputs: its mutation outputs are found again by tracing."""

    def run(*flat: Any) -> list[Any]:
        outs = fn(*flat)
        outs = list(outs) if isinstance(outs, tuple | list) else [outs]
        if len(outs) != n:
            raise LoweringError(f"the graph returns {len(outs)} values, its signature lists {n}")
        return [outs[k] for k in user]

    return run


Lowered = tuple[torch.fx.GraphModule, list[IOSpec], list[IOSpec]]


@dataclass(frozen=True)
class _Lowering:
    """What both lowerings take beside the inputs: the function returning the user outputs,
    the program's signature, which of its outputs are the user's, the decomposition table."""

    fn: Callable[..., Any]
    sig: ProgramSignature
    user: tuple[int, ...]
    table: Table

    def inference(self, inputs: list[Any]) -> Lowered:
        """``(*inputs) -> (*mutations, *user outputs)``: aotgraph's forward trace, every
        output kept (an input returned as it is, or a view of one, stays a graph output)."""
        gm = trace_without_grad(self.fn, inputs, self.table)
        mutated = _finish(gm, len(inputs), len(self.user))
        _name_placeholders(gm, self.sig.inputs)
        outs = _output_nodes(gm)
        n = len(self.user)
        _set_outputs(gm, [*outs[n:], *outs[:n]])
        specs = _mutation_specs(self.sig, mutated, outs[n:])
        specs += [_renamed(self.sig.outputs[k], outs[j]) for j, k in enumerate(self.user)]
        return gm, specs, []

    def joint(self, inputs: list[Any]) -> Lowered:
        """``(*inputs, *tangents) -> (*mutations, *user outputs, *gradients)``: aotgraph's
        joint trace. Each user output must be a tensor the graph computes (not an input, a
        view of another output, or a constant): those have no place among a joint graph's
        outputs."""
        with torch.enable_grad():
            traced_sig = analyze(self.fn, inputs, grad=True)  # type: ignore[arg-type]
        kinds = [o.kind for o in traced_sig.outputs]
        if any(kind != "graph" for kind in kinds):
            raise LoweringError(f"the joint IR needs outputs the graph computes; they are {kinds}")
        if not traced_sig.training:  # torch.autograd.grad would refuse: say why instead
            raise LoweringError(
                "the joint IR needs an input that requires grad (a parameter, or a user input with "
                "requires_grad) and an output computed from it; the inference IR has the rest"
            )
        graph = trace_joint(self.fn, inputs, traced_sig, self.table)
        gm, n, n_mut = graph.gm, graph.num_outputs, len(graph.mutated)
        _name_placeholders(gm, self.sig.inputs)
        outs = _output_nodes(gm)
        grads = outs[n + n_mut :]
        _set_outputs(gm, [*outs[n : n + n_mut], *outs[:n], *grads])
        specs = _mutation_specs(self.sig, graph.mutated, outs[n : n + n_mut])
        specs += [_renamed(self.sig.outputs[k], outs[j]) for j, k in enumerate(self.user)]
        grad_inputs = zip(traced_sig.grad_inputs, grads, strict=True)
        specs += [_gradient_spec(self.sig.inputs[i], g) for i, g in grad_inputs]
        tangents = [n for n in gm.graph.find_nodes(op="placeholder")][len(inputs) :]
        of = [specs[n_mut + j].name for j in traced_sig.grad_outputs]
        extra = [IOSpec("tangent", t.name, target) for t, target in zip(tangents, of, strict=True)]
        return gm, specs, extra


def _name_placeholders(gm: torch.fx.GraphModule, specs: Sequence[IOSpec]) -> None:
    """The exported names back on the primals (``_finish`` numbered them); a node that had
    one of those names (an input called ``mm``) gets a suffix. Set as ``_finish`` sets them."""
    wanted = {str(spec.name) for spec in specs}
    taken = {node.name for node in gm.graph.nodes} | wanted
    primals = list(gm.graph.find_nodes(op="placeholder"))[: len(specs)]
    for node in gm.graph.nodes:
        if node.name in wanted and node not in primals:
            k = 1
            while f"{node.name}_{k}" in taken:
                k += 1
            node.name = f"{node.name}_{k}"
            taken.add(node.name)
    for node, spec in zip(primals, specs, strict=True):
        node.name = node.target = str(spec.name)
    gm.recompile()


def _output_nodes(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.output_node().args[0])  # type: ignore[arg-type]


def _set_outputs(gm: torch.fx.GraphModule, values: list[Any]) -> None:
    gm.graph.output_node().args = (tuple(values),)
    gm.graph.lint()
    gm.recompile()


def _node_name(value: Any) -> str | None:
    return value.name if isinstance(value, torch.fx.Node) else None


def _renamed(spec: IOSpec, value: Any) -> IOSpec:
    return IOSpec(spec.kind, _node_name(value), spec.target, spec.leaf)


# What a write into an input of each kind becomes: an output kind and where it goes back.
_MUTATIONS: dict[str, tuple[str, Callable[[IOSpec], str | None]]] = {
    "buffer": ("buffer_mutation", lambda s: s.target),
    "user_input": ("user_input_mutation", lambda s: s.name),
}
# What the gradient of an input of each kind is.
_GRADIENTS: dict[str, tuple[str, Callable[[IOSpec], str | None]]] = {
    "parameter": ("gradient_to_parameter", lambda s: s.target),
    "user_input": ("gradient_to_user_input", lambda s: s.name),
}


def _mutation_specs(
    sig: ProgramSignature, mutated: Sequence[int], values: list[Any]
) -> list[IOSpec]:
    out = []
    for i, value in zip(mutated, values, strict=True):
        spec = sig.inputs[i]
        if spec.kind not in _MUTATIONS:
            raise LoweringError(
                f"the program writes {spec.kind} {spec.target or spec.name} in place"
            )
        kind, target = _MUTATIONS[spec.kind]
        out.append(IOSpec(kind, _node_name(value), target(spec)))
    return out


def _gradient_spec(spec: IOSpec, value: Any) -> IOSpec:
    if spec.kind not in _GRADIENTS:
        raise LoweringError(f"{spec.kind} {spec.target or spec.name} requires grad: not supported")
    kind, target = _GRADIENTS[spec.kind]
    return IOSpec(kind, _node_name(value), target(spec))


def _input_value(spec: IOSpec, leaves: list[Any], table: Mapping[str, Any]) -> Any:
    """The value of one input: a user's leaf, or a tensor of the program by name."""
    if spec.kind == "user_input":
        assert spec.leaf is not None  # ProgramSignature.from_json checked it
        if spec.leaf >= len(leaves):
            raise LoweringError(f"input {spec.name} is leaf {spec.leaf}; there are {len(leaves)}")
        return leaves[spec.leaf]
    key = f"constant:{spec.target}" if spec.kind == "constant_tensor" else str(spec.target)
    if key not in table:
        raise LoweringError(f"no tensor {spec.target!r} for {spec.kind} input {spec.name!r}")
    return table[key]
