"""torch's ``_foreach_*`` operations, as one operation per tensor.

``torch._foreach_add_(xs, ys, alpha=a)`` applies ``x.add_(y, alpha=a)`` to each pair of a
list of tensors; the optimizers' multi-tensor paths are written in them. Here each is the
loop it stands for, so the graph holds one plain operation per tensor, which every
backend handles (the inductor backend fuses them). An argument that is a list or tuple
is taken item by item, anything else (a number, a 0-d tensor) is given to every tensor,
and a 1-d tensor of scalars (``addcdiv``'s ``scalars``, as ``torch.optim`` stacks them
while compiling) is indexed per tensor.

>>> import torch
>>> xs = [torch.ones(2), torch.zeros(1)]
>>> FOREACH["_foreach_add_"](xs, [torch.ones(2), torch.ones(1)], alpha=2) is xs
True
>>> [x.tolist() for x in xs]
[[3.0, 3.0], [2.0]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember.capture.polyfills import POLYFILLS


def _each(op: Callable[..., Any], inplace: bool, scalars: int | None = None) -> Any:
    """The foreach form of ``op``; ``scalars``: the position of a per-tensor scalars argument."""

    def foreach(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(self, list | tuple):  # _foreach_pow(scalar, exponents)
            return [op(self, e) for e in args[0]]
        out = []
        for i, t in enumerate(self):
            row = []
            for j, a in enumerate(args):
                if isinstance(a, list | tuple):
                    a = a[i]
                elif j + 1 == scalars and isinstance(a, torch.Tensor) and a.dim() == 1:
                    a = a[i]
                row.append(a)
            named = {k: v[i] if isinstance(v, list | tuple) else v for k, v in kwargs.items()}
            out.append(op(t, *row, **named))
        return self if inplace else out  # torch's in-place forms return their list

    return foreach


def _maximum_(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return t.copy_(torch.maximum(t, other))  # torch has no Tensor.maximum_


def _addcdiv(t: Any, a: Any, b: Any, value: Any = 1, *, out_of_place: bool = False) -> Any:
    if isinstance(value, torch.Tensor):  # a tensor scalar: addcdiv takes numbers only
        return t + a / b * value if out_of_place else t.add_(a / b * value)
    return torch.addcdiv(t, a, b, value=value) if out_of_place else t.addcdiv_(a, b, value=value)


def _addcmul(t: Any, a: Any, b: Any, value: Any = 1, *, out_of_place: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        return t + a * b * value if out_of_place else t.add_(a * b * value)
    return torch.addcmul(t, a, b, value=value) if out_of_place else t.addcmul_(a, b, value=value)


def _addcdiv_(t: Any, a: Any, b: Any, value: Any = 1) -> Any:
    return _addcdiv(t, a, b, value)


def _addcdiv_out(t: Any, a: Any, b: Any, value: Any = 1) -> Any:
    return _addcdiv(t, a, b, value, out_of_place=True)


def _addcmul_(t: Any, a: Any, b: Any, value: Any = 1) -> Any:
    return _addcmul(t, a, b, value)


def _addcmul_out(t: Any, a: Any, b: Any, value: Any = 1) -> Any:
    return _addcmul(t, a, b, value, out_of_place=True)


# ops whose foreach forms are torch.<op> (a new list) and Tensor.<op>_ (in place)
_PAIRED = ("add", "sub", "mul", "div", "pow", "neg", "sqrt", "reciprocal", "lerp")

# name -> the per-tensor operation and whether the foreach form works in place
_OPS: dict[str, tuple[Callable[..., Any], bool]] = {
    **{f"_foreach_{op}": (getattr(torch, op), False) for op in _PAIRED},
    **{f"_foreach_{op}_": (getattr(torch.Tensor, f"{op}_"), True) for op in _PAIRED},
    "_foreach_maximum": (torch.maximum, False),
    "_foreach_maximum_": (_maximum_, True),
    "_foreach_minimum": (torch.minimum, False),
    "_foreach_clamp_min_": (torch.Tensor.clamp_min_, True),
    "_foreach_zero_": (torch.Tensor.zero_, True),
    "_foreach_copy_": (torch.Tensor.copy_, True),
    "_foreach_addcdiv": (_addcdiv_out, False),
    "_foreach_addcdiv_": (_addcdiv_, True),
    "_foreach_addcmul": (_addcmul_out, False),
    "_foreach_addcmul_": (_addcmul_, True),
}
_SCALARS_AT = {
    name: 3 for name in _OPS if name.startswith(("_foreach_addcdiv", "_foreach_addcmul"))
}

# name -> the polyfill of torch.<name>
FOREACH: dict[str, Any] = {
    name: _each(op, inplace, _SCALARS_AT.get(name)) for name, (op, inplace) in _OPS.items()
}
POLYFILLS.update({getattr(torch, name): fn for name, fn in FOREACH.items()})
