"""What :func:`ember.capture.export` returns: the graph, its signature, its state.

An :class:`ExportedProgram` is plain data around one ``torch.fx.GraphModule`` whose
placeholders are, in order, the parameters, the buffers, the constant tensors and the
user's inputs; its output tuple is the mutated buffers and user inputs, then the user's
outputs. The :class:`ExportSignature` (frozen dataclasses, JSON-able) says which is which,
and holds the pytree specs of the calling convention and the input checks.
:meth:`ExportedProgram.module` gives back a callable module with the original calling
convention.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.guards import Local, TensorSize
from ember.guards.relations import ShapeRelation

__all__ = [
    "CheckError",
    "DimRange",
    "ExportError",
    "ExportSignature",
    "ExportedModule",
    "ExportedProgram",
    "InputKind",
    "InputSpec",
    "LeafCheck",
    "OutputKind",
    "OutputSpec",
    "Relation",
]


class ExportError(RuntimeError):
    """``f`` cannot be exported: a graph break (all of them listed), an unexportable side
    effect, input or output."""


class InputKind(enum.StrEnum):
    """What a placeholder of an exported graph is."""

    USER_INPUT = "user_input"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT_TENSOR = "constant_tensor"


class OutputKind(enum.StrEnum):
    """What an output of an exported graph is."""

    USER_OUTPUT = "user_output"
    BUFFER_MUTATION = "buffer_mutation"  # the buffer's new value (written back by .module())
    USER_INPUT_MUTATION = "user_input_mutation"  # the same, for a user's input tensor


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One placeholder: its ``name`` in the graph, its kind, and what it is.

    >>> spec = InputSpec(InputKind.BUFFER, "b_bn_running_mean", target="bn.running_mean")
    >>> spec.kind.value, spec.target, spec.leaf
    ('buffer', 'bn.running_mean', None)
    """

    kind: InputKind
    name: str
    target: str | None = None  # the fully qualified name (parameter, buffer) or constant's name
    leaf: int | None = None  # a user input: its index among the flattened (args, kwargs)


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """One item of the graph's output tuple: its node's ``name`` (None for a constant)."""

    kind: OutputKind
    name: str | None
    target: str | None = None  # the mutated buffer's FQN, or the mutated input's placeholder


@dataclass(frozen=True, slots=True)
class DimRange:
    """A dynamic dimension (``Dim``) by name, with its bounds (None: unbounded)."""

    name: str
    min: int | None = None
    max: int | None = None


@dataclass(frozen=True, slots=True)
class LeafCheck:
    """What a flattened input must be at each call: a tensor of ``dtype`` and ``sizes`` (an
    int, or a ``Dim``'s name), a number of ``pytype`` (a graph input), or equal to ``value``
    (a constant the graph was specialised for)."""

    leaf: int
    path: str  # how the user wrote it: args[0], kwargs['mask'][1]
    kind: str  # "tensor" | "number" | "constant"
    dtype: str | None = None
    sizes: tuple[int | str, ...] = ()
    pytype: str | None = None
    value: Any = None


@dataclass(frozen=True, slots=True)
class Relation:
    """A shape relation the graph relies on (``s0 >= 2``, ``s0 == 2 * s1``), each symbol
    read as ``(symbol, leaf, dim)``: size ``dim`` of flattened input ``leaf``."""

    expr: str
    symbols: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class ExportSignature:
    """What each input and output of the graph is, the calling convention, and the checks.

    ``in_spec``/``out_spec`` are ``torch.utils._pytree`` specs in their JSON form
    (``treespec_dumps``).
    """

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    in_spec: str
    out_spec: str
    checks: tuple[LeafCheck, ...] = ()
    dims: tuple[DimRange, ...] = ()
    relations: tuple[Relation, ...] = ()
    # pairs of flattened inputs that were one tensor while exporting: the graph reads one
    same: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``from_json`` reads it back).

        >>> sig = ExportSignature((), (), "[]", "[]")
        >>> ExportSignature.from_json(sig.to_json()) == sig
        True
        """
        out = asdict(self)
        out["inputs"] = [{**i, "kind": i["kind"].value} for i in out["inputs"]]
        out["outputs"] = [{**o, "kind": o["kind"].value} for o in out["outputs"]]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportSignature:
        """The signature ``to_json`` wrote; a ``ValueError`` for anything else."""
        try:
            return cls(
                inputs=tuple(
                    InputSpec(**{**i, "kind": InputKind(i["kind"])}) for i in data["inputs"]
                ),
                outputs=tuple(
                    OutputSpec(**{**o, "kind": OutputKind(o["kind"])}) for o in data["outputs"]
                ),
                in_spec=str(data["in_spec"]),
                out_spec=str(data["out_spec"]),
                checks=tuple(
                    LeafCheck(**{**c, "sizes": tuple(c["sizes"])}) for c in data["checks"]
                ),
                dims=tuple(DimRange(**d) for d in data["dims"]),
                relations=tuple(
                    Relation(r["expr"], tuple(tuple(s) for s in r["symbols"]))
                    for r in data["relations"]
                ),
                same=tuple((int(a), int(b)) for a, b in data.get("same", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an export signature: {type(e).__name__}: {e}") from None


class CheckError(ValueError):
    """A call of an exported program with inputs its graph was not exported for."""


_FUNCTIONS = {"min": min, "max": max, "Min": min, "Max": max}


@dataclass(eq=False)
class ExportedProgram:
    """One exported graph with its signature, parameters/buffers and constant tensors.

    >>> import torch, ember.capture
    >>> ep = ember.capture.export(torch.nn.Linear(3, 2), (torch.ones(4, 3),))
    >>> [(s.kind.value, s.target) for s in ep.signature.inputs]
    [('parameter', 'weight'), ('parameter', 'bias'), ('user_input', None)]
    >>> ep.module()(torch.ones(4, 3)).shape
    torch.Size([4, 2])
    """

    graph_module: torch.fx.GraphModule
    signature: ExportSignature
    state_dict: dict[str, torch.Tensor]  # parameters and buffers by fully qualified name
    constants: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def graph(self) -> torch.fx.Graph:
        """The graph (placeholders in the order of ``signature.inputs``)."""
        return self.graph_module.graph

    def module(self) -> ExportedModule:
        """A module called as the original was (same args and kwargs), checking its
        inputs, writing mutated buffers back, and returning the original's outputs. It
        holds this program's own tensors (as torch's ``ExportedProgram.module()`` does)."""
        return ExportedModule(self)

    def check_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
        """The flattened ``(args, kwargs)``, after checking them (:class:`CheckError`)."""
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        want = pytree.treespec_loads(self.signature.in_spec)
        if spec != want:
            raise CheckError(f"the exported program takes inputs structured as {want}, got {spec}")
        bound: dict[str, tuple[int, str]] = {}  # Dim name -> (size, where it was read)
        for check in self.signature.checks:
            _check_leaf(check, leaves[check.leaf], bound)
        ranges = {d.name: d for d in self.signature.dims}
        for name, (size, where) in bound.items():
            _check_range(ranges.get(name), size, where)
        for relation in self.signature.relations:
            _check_relation(relation, leaves, self.signature.checks)
        paths = {c.leaf: c.path for c in self.signature.checks}
        for a, b in self.signature.same:
            if leaves[a] is not leaves[b]:
                raise CheckError(
                    f"{paths[a]} and {paths[b]} must be the same tensor, as when exported"
                )
        return leaves

    def save(self, path: str) -> None:
        """Write the program to the directory ``path`` (``docs/export.md`` has the format)."""
        from ember.capture import export_format

        export_format.save(self, path)

    def __str__(self) -> str:
        return self.graph_module.print_readable(False)


def _check_leaf(check: LeafCheck, value: Any, bound: dict[str, tuple[int, str]]) -> None:
    """One flattened input against its check; ``bound`` collects each Dim's size."""
    rule = _LEAF_CHECKS.get(check.kind)
    if rule is None:
        raise CheckError(f"{check.path}: unknown check kind {check.kind!r}")
    rule(check, value, bound)


def _check_constant(check: LeafCheck, value: Any, bound: dict[str, tuple[int, str]]) -> None:
    if type(value) is not type(check.value) or value != check.value:
        raise CheckError(
            f"{check.path}: the program was exported for {check.value!r}, got {value!r}"
        )


def _check_number(check: LeafCheck, value: Any, bound: dict[str, tuple[int, str]]) -> None:
    if type(value).__name__ != check.pytype:
        raise CheckError(f"{check.path}: expected a {check.pytype}, got {value!r}")


def _check_tensor(check: LeafCheck, value: Any, bound: dict[str, tuple[int, str]]) -> None:
    if not isinstance(value, torch.Tensor):
        raise CheckError(f"{check.path}: expected a tensor, got {type(value).__name__}")
    if str(value.dtype) != check.dtype:
        raise CheckError(f"{check.path}: expected dtype {check.dtype}, got {value.dtype}")
    if value.dim() != len(check.sizes):
        raise CheckError(
            f"{check.path}: expected {len(check.sizes)} dimensions, got {value.dim()}"
            f" (shape {tuple(value.shape)})"
        )
    for d, (want, got) in enumerate(zip(check.sizes, value.shape, strict=True)):
        where = f"{check.path}.size({d})"
        if isinstance(want, int) and want != got:
            raise CheckError(f"{where}: expected {want}, got {got} (a static size)")
        if isinstance(want, str):
            first = bound.setdefault(want, (got, where))
            if first[0] != got:
                raise CheckError(
                    f"{where} is {got} but {first[1]} is {first[0]}: both are Dim {want!r}"
                )


# LeafCheck.kind -> its check: equal to the exported value, a number of its type, a tensor
_LEAF_CHECKS: dict[str, Callable[[LeafCheck, Any, dict[str, tuple[int, str]]], None]] = {
    "constant": _check_constant,
    "number": _check_number,
    "tensor": _check_tensor,
}


def _check_range(dim: DimRange | None, size: int, where: str) -> None:
    if dim is None:
        return
    if dim.min is not None and size < dim.min:
        raise CheckError(f"{where} (Dim {dim.name!r}) is {size}, below its min {dim.min}")
    if dim.max is not None and size > dim.max:
        raise CheckError(f"{where} (Dim {dim.name!r}) is {size}, above its max {dim.max}")


def _check_relation(relation: Relation, leaves: list[Any], checks: tuple[LeafCheck, ...]) -> None:
    """A shape relation over the inputs' sizes; parsed by ember.guards, which accepts only
    arithmetic and comparisons of its symbols (a loaded file's text is never run as code)."""
    paths = {c.leaf: c.path for c in checks}
    rel = ShapeRelation.parse(
        relation.expr,
        {
            s: TensorSize(Local(paths.get(leaf, f"input {leaf}")), d)
            for s, leaf, d in relation.symbols
        },
    )
    values = {s: int(leaves[leaf].shape[d]) for s, leaf, d in relation.symbols}
    code = compile(rel.tree, "<shape relation>", "eval")
    if not eval(code, {"__builtins__": {}, **_FUNCTIONS}, values):
        raise CheckError(f"the exported graph needs {rel.explain(values)}")


class ExportedModule(torch.nn.Module):
    """What :meth:`ExportedProgram.module` returns: call it as the original was called.

    Parameters and buffers are registered under their fully qualified names, so that
    ``state_dict()`` has the original's keys (those the graph uses).
    """

    def __init__(self, program: ExportedProgram) -> None:
        super().__init__()
        for fqn, tensor in program.state_dict.items():
            owner, name = _owner(self, fqn)
            if isinstance(tensor, torch.nn.Parameter):
                owner.register_parameter(name, tensor)
            else:
                owner.register_buffer(name, tensor)
        object.__setattr__(self, "_program", program)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        program: ExportedProgram = self.__dict__["_program"]
        leaves = program.check_inputs(args, kwargs)
        sig = program.signature
        inputs = [self._input(spec, leaves, program) for spec in sig.inputs]
        outs = program.graph_module(*inputs)
        by_name = {spec.name: value for spec, value in zip(sig.inputs, inputs, strict=True)}
        user = []
        for spec, value in zip(sig.outputs, outs, strict=True):
            if spec.kind is OutputKind.USER_OUTPUT:
                user.append(value)
                continue
            if spec.kind is OutputKind.BUFFER_MUTATION:
                target = self.get_buffer(spec.target or "")
            else:
                target = by_name[spec.target or ""]
            if value is not target:  # a graph that computed the new value out of place
                with torch.no_grad():
                    target.copy_(value)
        return pytree.tree_unflatten(user, pytree.treespec_loads(sig.out_spec))

    def _input(self, spec: InputSpec, leaves: list[Any], program: ExportedProgram) -> Any:
        if spec.kind is InputKind.USER_INPUT:
            return leaves[spec.leaf or 0]
        if spec.kind is InputKind.PARAMETER:
            return self.get_parameter(spec.target or "")
        if spec.kind is InputKind.BUFFER:
            return self.get_buffer(spec.target or "")
        return program.constants[spec.target or ""]


def _owner(root: torch.nn.Module, fqn: str) -> tuple[torch.nn.Module, str]:
    """The submodule that holds ``fqn`` (made empty where missing), and the last name."""
    *path, name = fqn.split(".")
    module = root
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    return module, name
