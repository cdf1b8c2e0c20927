"""Dynamic dimensions of an exported program, kept dynamic through the aten trace.

A ``Dim`` in the signature's checks (a size written as the Dim's name) becomes one symbol
of a fresh ``ShapeEnv``, with the Dim's bounds as its range, and every input that carries
it a fake tensor with that symbol as its size; aotgraph's trace then records sizes as
``sym_size`` nodes instead of numbers. Sizes 0 and 1 specialise as in capture, so each
Dim's lower bound becomes at least 2 in the lowered signature (:func:`dynamic_dims`).
A guard the trace adds on the sizes (``aten.convolution``'s ``s0 < 16``) becomes a shape
relation of the lowered signature (:meth:`SymbolicInputs.relations`), checked on every
call. A guard on a float input, or one the relation checker cannot read, makes the
caller trace again at the example's sizes.

>>> from ember.aotgraph import IOSpec
>>> sig = ProgramSignature((IOSpec("user_input", "x", leaf=0),), (), {
...     "checks": [{"leaf": 0, "path": "args[0]", "kind": "tensor", "dtype": "torch.float32",
...                 "sizes": ["batch", 3]}],
...     "dims": [{"name": "batch", "min": None, "max": 64}]})
>>> shapes = symbolic_inputs(sig, [torch.ones(5, 3)])
>>> (x,) = shapes.values
>>> type(x.shape[0]).__name__, x.shape[1], dynamic_dims(sig)
('SymInt', 3, [{'name': 'batch', 'min': 2, 'max': 64}])
>>> bool(x.shape[0] < 16)  # a guard, as a kernel choosing by size adds one
True
>>> [r["expr"].replace(str(x.shape[0]), "s") for r in shapes.relations([torch.ones(5, 3)])]
['s < 16']
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._guards import GuardSource, SLoc, Source
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from ember.aotgraph.exported_checks import LoweringError, relation_holds
from ember.aotgraph.program_signature import ProgramSignature
from ember.aotgraph.trace import Specialized

__all__ = ["SymbolicInputs", "dynamic_dims", "symbolic_inputs"]


@dataclass(frozen=True)
class _DimSource(Source):
    """Names a Dim's symbol for the shape environment."""

    dim: str

    @functools.cached_property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL

    @property
    def _name_template(self) -> str:
        return f"dim_{self.dim}"


class _ShapeEnv(ShapeEnv):
    """A ``ShapeEnv`` that keeps its guards for :meth:`SymbolicInputs.relations` (not
    aotgraph's ``QuietShapeEnv``, on which any guard stops the trace), and, like it, does
    not look for the user's source line of each guard."""

    def _get_stack_summary(
        self, is_debug: bool = False, framework_loc: str | None = None
    ) -> tuple[SLoc, str]:
        return SLoc(framework_loc or "ember.aotgraph", None), ""


@dataclass
class SymbolicInputs:
    """The inputs to trace with, and where each size symbol is read: ``(leaf, dim)``."""

    values: list[Any]
    env: ShapeEnv
    where: dict[Any, tuple[int, int]] = field(default_factory=dict)  # sympy symbol ->

    def relations(self, leaves: list[Any]) -> list[dict[str, Any]]:
        """The guards the trace added, as signature relations; :class:`Specialized` if one
        reads a float input or cannot be checked (then trace at the example's sizes)."""
        out = []
        for guard in self.env.guards:
            expr = guard.expr
            used = sorted(expr.free_symbols, key=str)
            if not used or any(s not in self.where for s in used):
                raise Specialized(f"a guard on a float input: {expr}")
            text, symbols = str(expr), [[str(s), *self.where[s]] for s in used]
            values = {str(s): int(leaves[leaf].shape[d]) for s, (leaf, d) in self.where.items()}
            try:
                holds = relation_holds(text, values)
            except LoweringError as e:
                raise Specialized(str(e)) from None
            if not holds:
                raise Specialized(f"the guard {expr} is false for the example")
            out.append({"expr": text, "symbols": symbols})
        return out


def _dynamic(check: Any) -> bool:
    return check["kind"] == "tensor" and any(isinstance(s, str) for s in check["sizes"])


def symbolic_inputs(sig: ProgramSignature, inputs: Sequence[Any]) -> SymbolicInputs | None:
    """``inputs`` with each input that has a dynamic size as a fake tensor over symbols;
    None when no check names a Dim."""
    checks = {c["leaf"]: c for c in sig.extra.get("checks", ()) if _dynamic(c)}
    if not checks:
        return None
    env = _ShapeEnv()
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=env, static_shapes=True)
    bounds = {d["name"]: d for d in sig.extra.get("dims", ())}
    symbols: dict[str, torch.SymInt] = {}
    shapes = SymbolicInputs(list(inputs), env)
    for k, spec in enumerate(sig.inputs):
        check = checks.get(spec.leaf) if spec.kind == "user_input" else None
        if check is None:
            continue
        value: torch.Tensor = inputs[k]
        sizes: list[Any] = []
        for d, size in enumerate(check["sizes"]):
            if isinstance(size, str) and size not in symbols:
                symbols[size] = _symbol(env, size, int(value.shape[d]), bounds.get(size, {}))
                shapes.where[symbols[size].node.expr] = (check["leaf"], d)
            sizes.append(symbols[size] if isinstance(size, str) else size)
        with mode:
            fake = torch.empty(sizes, dtype=value.dtype, device=value.device)
        shapes.values[k] = fake.requires_grad_(value.requires_grad)
    return shapes


def _symbol(env: ShapeEnv, name: str, hint: int, bounds: dict[str, Any]) -> torch.SymInt:
    source = _DimSource(name)
    sym = env.create_symbol(hint, source, dynamic_dim=DimDynamic.DYNAMIC)
    low, high = bounds.get("min"), bounds.get("max")
    env.constrain_symbol_range(sym, max(low or 2, 2), high if high is not None else 2**62)
    node = env.create_symintnode(sym, hint=hint, source=source)
    assert isinstance(node, torch.SymInt)  # a fresh symbol, not a constant
    return node


def dynamic_dims(sig: ProgramSignature) -> list[dict[str, Any]]:
    """The signature's ``dims`` for a graph traced over :func:`symbolic_inputs`: every Dim
    the checks name, its lower bound at least 2 (sizes 0 and 1 were specialised away)."""
    names = {s for c in sig.extra.get("checks", ()) if _dynamic(c) for s in c["sizes"]}
    dims = {d["name"]: dict(d) for d in sig.extra.get("dims", ())}
    for name in sorted(n for n in names if isinstance(n, str)):
        dim = dims.setdefault(name, {"name": name, "min": None, "max": None})
        dim["min"] = max(dim.get("min") or 2, 2)
    return list(dims.values())
