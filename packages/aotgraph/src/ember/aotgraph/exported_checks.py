"""Calling a lowered exported program: its inputs checked, its mutations written back.

The checks read the signature's ``checks`` JSON (one per flattened input, as
``ember.capture.export`` writes them): the pytree structure of ``(args, kwargs)``, each
tensor's dtype, rank and sizes (an int, or a ``Dim``'s name, which every size carrying
it must share, within the ``dims`` bounds), each number's type and each constant's
value, and the shape ``relations`` over the sizes (:func:`relation_holds`).

>>> sig = ProgramSignature((), (), {"checks": [
...     {"leaf": 0, "path": "args[0]", "kind": "tensor", "dtype": "torch.float32", "sizes": [2]}]})
>>> check_call(sig, (torch.ones(3),), {})
Traceback (most recent call last):
ember.aotgraph.exported_checks.LoweringError: args[0].size(0): expected 2, got 3
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from ember.aotgraph.program_signature import IOSpec, ProgramSignature

if TYPE_CHECKING:
    from ember.aotgraph.exported import AtenProgram

__all__ = [
    "LoweredModule",
    "LoweringError",
    "check_call",
    "example_leaves",
    "relation_holds",
    "static_checks",
]


class LoweringError(ValueError):
    """A program :func:`~ember.aotgraph.lower_exported` cannot lower, or a call of a lowered
    program with inputs it was not lowered for.

    >>> from ember.aotgraph import lower_exported
    >>> lower_exported(torch.fx.symbolic_trace(lambda x: x), {"inputs": [], "outputs": []}, {})
    Traceback (most recent call last):
    ember.aotgraph.exported_checks.LoweringError: the signature names inputs [], the graph's ...
    """


Bound = dict[str, tuple[int, str]]  # a Dim's name -> (its size, where it was read)


def check_call(sig: ProgramSignature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The flattened ``(args, kwargs)``, after checking them against ``sig``'s checks."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if "in_spec" in sig.extra:
        want = pytree.treespec_loads(sig.extra["in_spec"])
        if spec != want:
            raise LoweringError(f"the program takes inputs structured as {want}, got {spec}")
    bound: Bound = {}
    for check in sig.extra.get("checks", ()):
        leaf = check["leaf"]
        if leaf >= len(leaves):
            raise LoweringError(f"{check['path']}: missing (the call has {len(leaves)} inputs)")
        rule = _CHECKS.get(check["kind"])
        if rule is None:
            raise LoweringError(f"{check['path']}: unknown check kind {check['kind']!r}")
        rule(check, leaves[leaf], bound)
    ranges = {d["name"]: d for d in sig.extra.get("dims", ())}
    for name, (size, where) in bound.items():
        low, high = ranges.get(name, {}).get("min"), ranges.get(name, {}).get("max")
        if (low is not None and size < low) or (high is not None and size > high):
            raise LoweringError(f"{where} (Dim {name!r}) is {size}, outside [{low}, {high}]")
    for a, b in sig.extra.get("same", ()):
        if leaves[a] is not leaves[b]:
            raise LoweringError(f"inputs {a} and {b} must be the same tensor, as when exported")
    for relation in sig.extra.get("relations", ()):
        _check_relation(relation, leaves)
    return leaves


def _check_relation(relation: Mapping[str, Any], leaves: list[Any]) -> None:
    """A shape relation (``s0 >= 2``, ``Eq(s0, 2*s1)``) over the inputs' sizes."""
    expr, values = relation["expr"], {}
    for name, leaf, dim in relation["symbols"]:
        value = leaves[leaf] if 0 <= leaf < len(leaves) else None
        if not isinstance(value, torch.Tensor) or dim >= value.dim():
            raise LoweringError(f"shape relation {expr!r}: input {leaf} has no size {dim}")
        values[name] = int(value.shape[dim])
    if not relation_holds(expr, values):
        shown = ", ".join(f"{k} = {v}" for k, v in values.items())
        raise LoweringError(f"the program needs {expr} ({shown})")


def relation_holds(expr: str, values: Mapping[str, int]) -> bool:
    """Evaluate a shape relation's text over ``values``: integer arithmetic, comparisons and
    sympy's ``Eq``/``Mod``/``Min``/... only (a loaded file's text is never run as code).

    >>> relation_holds("Eq(Mod(s0, 2), 0) & (s0 <= 2 * s1)", {"s0": 4, "s1": 3})
    True
    >>> relation_holds("s0.__class__", {"s0": 1})
    Traceback (most recent call last):
    ember.aotgraph.exported_checks.LoweringError: cannot check shape relation 's0.__class__': ...
    """
    try:
        return bool(_evaluate(ast.parse(expr.strip(), mode="eval").body, values))
    except (SyntaxError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise LoweringError(f"cannot check shape relation {expr!r}: {e!r}") from None


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,  # no **: 2 ** 10 ** 9 would hang
    ast.BitAnd: lambda a, b: bool(a) and bool(b), ast.BitOr: lambda a, b: bool(a) or bool(b),
}  # fmt: skip
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
    ast.Invert: operator.not_,  # sympy's ~ is logical not (relations are booleans)
}  # fmt: skip
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}  # fmt: skip
# the functions sympy prints in a relation
_CALLS: dict[str, Callable[..., Any]] = {
    "Eq": operator.eq, "Ne": operator.ne, "Lt": operator.lt, "Le": operator.le,
    "Gt": operator.gt, "Ge": operator.ge, "Mod": operator.mod, "FloorDiv": operator.floordiv,
    "Min": min, "Max": max, "Abs": abs, "And": lambda *a: all(a), "Or": lambda *a: any(a),
    "Not": operator.not_,
}  # fmt: skip


def _evaluate(node: ast.AST, values: Mapping[str, int]) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left, values), _evaluate(node.right, values))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, values))
    if isinstance(node, ast.BoolOp):
        results = [bool(_evaluate(v, values)) for v in node.values]
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        sides = [_evaluate(n, values) for n in (node.left, *node.comparators)]
        pairs = zip(node.ops, sides, sides[1:], strict=False)
        return all(_COMPARE[type(op)](a, b) for op, a, b in pairs)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in _CALLS:
            return _CALLS[node.func.id](*(_evaluate(a, values) for a in node.args))
    raise ValueError(f"{type(node).__name__} is not allowed")


def _check_tensor(check: Mapping[str, Any], value: Any, bound: Bound) -> None:
    path, sizes = check["path"], list(check["sizes"])
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"{path}: expected a tensor, got {type(value).__name__}")
    if str(value.dtype) != check["dtype"]:
        raise LoweringError(f"{path}: expected dtype {check['dtype']}, got {value.dtype}")
    if value.dim() != len(sizes):
        raise LoweringError(f"{path}: expected {len(sizes)} dimensions, got {value.dim()}")
    for d, (want, got) in enumerate(zip(sizes, value.shape, strict=True)):
        where = f"{path}.size({d})"
        if isinstance(want, int) and want != got:
            raise LoweringError(f"{where}: expected {want}, got {got}")
        if isinstance(want, str):
            first = bound.setdefault(want, (got, where))
            if first[0] != got:
                raise LoweringError(f"{where} is {got} but {first[1]} is {first[0]}: Dim {want!r}")


def _check_number(check: Mapping[str, Any], value: Any, bound: Bound) -> None:
    if type(value).__name__ != check["pytype"]:
        raise LoweringError(f"{check['path']}: expected a {check['pytype']}, got {value!r}")


def _check_constant(check: Mapping[str, Any], value: Any, bound: Bound) -> None:
    want = check["value"]
    if type(value) is not type(want) or value != want:
        raise LoweringError(
            f"{check['path']}: the program was exported for {want!r}, got {value!r}"
        )


# a check's kind -> its rule: a tensor's dtype and sizes, a number's type, a constant's value
_CHECKS: dict[str, Callable[[Mapping[str, Any], Any, Bound], None]] = {
    "tensor": _check_tensor,
    "number": _check_number,
    "constant": _check_constant,
}


def _example_tensor(check: Mapping[str, Any]) -> torch.Tensor:
    dynamic = [s for s in check["sizes"] if not isinstance(s, int)]
    if dynamic:
        raise LoweringError(
            f"{check['path']} has a dynamic size (Dim {dynamic[0]!r}): pass example args"
        )
    dtype = getattr(torch, str(check["dtype"]).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise LoweringError(f"{check['path']}: unknown dtype {check['dtype']!r}")
    return torch.zeros(check["sizes"], dtype=dtype)


_NUMBERS: dict[str, Any] = {"float": 1.0, "int": 1, "bool": True}
# a check's kind -> an example value it accepts (a tensor's values do not matter: traced fake)
_EXAMPLES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "tensor": _example_tensor,
    "number": lambda check: _NUMBERS.get(check["pytype"], 1.0),
    "constant": lambda check: check["value"],
}


def example_leaves(
    sig: ProgramSignature, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> list[Any]:
    """The flattened example inputs: the given ones (checked), or made from the checks."""
    if args is not None or kwargs is not None:
        return check_call(sig, tuple(args or ()), dict(kwargs or {}))
    checks = list(sig.extra.get("checks", ()))
    count = max(
        [c["leaf"] + 1 for c in checks] + [(s.leaf or 0) + 1 for s in sig.inputs_of("user_input")]
    )
    leaves: list[Any] = [None] * count
    for check in checks:
        if check["kind"] not in _EXAMPLES:
            raise LoweringError(f"{check['path']}: unknown check kind {check['kind']!r}")
        leaves[check["leaf"]] = _EXAMPLES[check["kind"]](check)
    for spec in sig.inputs_of("user_input"):
        if leaves[spec.leaf or 0] is None:
            raise LoweringError(f"no check describes input {spec.name!r}: pass example args")
    return leaves


def static_checks(sig: ProgramSignature, leaves: list[Any]) -> list[dict[str, Any]]:
    """The signature's checks with each dynamic size replaced by the example's size."""
    out = []
    for check in sig.extra.get("checks", ()):
        value = leaves[check["leaf"]]
        if check["kind"] == "tensor":
            sizes = [s if isinstance(s, int) else int(value.shape[d])
                     for d, s in enumerate(check["sizes"])]  # fmt: skip
            check = {**check, "sizes": sizes}
        out.append(dict(check))
    return out


class LoweredModule(torch.nn.Module):
    """What :meth:`AtenProgram.module` returns: called as the exported function was.

    Parameters and buffers are registered under their fully qualified names; buffer and
    input mutations the graph returns are copied back into them. The user's outputs come
    back in the signature's ``out_spec`` structure (a tuple where it has none).

    >>> from ember.aotgraph import lower_exported
    >>> def f(x, b_total):  # a graph that adds its input to a buffer
    ...     return (b_total.add_(x), x * 2)
    >>> sig = {"inputs": [{"kind": "user_input", "name": "x", "leaf": 0},
    ...                   {"kind": "buffer", "name": "b_total", "target": "total"}],
    ...        "outputs": [{"kind": "buffer_mutation", "name": "add_", "target": "total"},
    ...                    {"kind": "user_output", "name": "mul"}]}
    >>> m = lower_exported(torch.fx.symbolic_trace(f), sig, {"total": torch.zeros(2)},
    ...                    args=(torch.ones(2),)).module()
    >>> m(torch.ones(2)), m(torch.ones(2)), m.total
    ((tensor([2., 2.]),), (tensor([2., 2.]),), tensor([2., 2.]))
    """

    def __init__(self, program: AtenProgram) -> None:
        super().__init__()
        params = {s.target for s in program.signature.inputs_of("parameter")}
        for fqn, tensor in program.state_dict.items():
            owner, name = _owner(self, fqn)
            if fqn not in params:
                owner.register_buffer(name, tensor)
            elif isinstance(tensor, torch.nn.Parameter):
                owner.register_parameter(name, tensor)
            else:  # a plain tensor given for a parameter: shares its memory
                owner.register_parameter(name, torch.nn.Parameter(tensor, tensor.requires_grad))
        object.__setattr__(self, "_program", program)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        program: AtenProgram = self.__dict__["_program"]
        sig = program.signature
        leaves = check_call(sig, args, kwargs)
        inputs = [self._input(spec, leaves, program.constants) for spec in sig.inputs]
        by_name = {spec.name: value for spec, value in zip(sig.inputs, inputs, strict=True)}
        outs = program.graph_module(*inputs)
        user = []
        for spec, value in zip(sig.outputs, outs, strict=True):
            if spec.kind == "user_output":
                user.append(value)
                continue
            target = by_name[spec.target] if spec.kind == "user_input_mutation" else None
            target = self.get_buffer(spec.target or "") if target is None else target
            with torch.no_grad():
                target.copy_(value)
        if "out_spec" not in sig.extra:  # a signature written by hand may have none
            return tuple(user)
        return pytree.tree_unflatten(user, pytree.treespec_loads(sig.extra["out_spec"]))

    def _input(self, spec: IOSpec, leaves: list[Any], constants: Mapping[str, Any]) -> Any:
        if spec.kind == "user_input":
            return leaves[spec.leaf or 0]
        if spec.kind == "parameter":
            return self.get_parameter(spec.target or "")
        if spec.kind == "buffer":
            return self.get_buffer(spec.target or "")
        return constants[spec.target or ""]


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
