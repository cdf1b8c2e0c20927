"""The seam where a caller sees the compilers :func:`ember.aotgraph.aot_compile` is given.

While :data:`COMPILER_HOOK` holds a function ``(compiler, kind) -> compiler`` (``kind``:
``"forward"``, ``"backward"`` or ``"inference"``), ``aot_compile`` hands its aten graphs to
what that function returns instead. ``ember.compiler``'s minifier "after aot" sets it for
the duration of one backend call, so aotgraph never imports compiler-api.

>>> import torch
>>> from ember.aotgraph import aot_compile
>>> seen = []
>>> def spy(compiler, kind):
...     return lambda gm, inputs: seen.append(kind) or compiler(gm, inputs)
>>> token = COMPILER_HOOK.set(spy)
>>> f = aot_compile(torch.fx.symbolic_trace(lambda x: x * 2), [torch.ones(2)],
...                 fw_compiler=lambda gm, inputs: gm)
>>> COMPILER_HOOK.reset(token)
>>> seen
['inference']
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

Compiler = Callable[..., Any]

COMPILER_HOOK: ContextVar[Callable[[Compiler, str], Compiler] | None] = ContextVar(
    "ember_aotgraph_compiler_hook", default=None
)

# True while ``aot_compile`` compiles a backward graph. It calls what the compiler returns
# boxed where it can: ``compiled.call_boxed(args)`` with one list of the saved values and
# tangents that the callee may empty (and then drop each value after its last use), having
# released the autograd context's references first, so the saved activations are freed as
# the backward pass goes instead of at its end (torch's ``_boxed_call`` convention does the
# same). A compiler may read this to generate such an entry; one that does not is called
# with the values as arguments.
CALLED_BOXED: ContextVar[bool] = ContextVar("ember_aotgraph_called_boxed", default=False)


def hooked(compiler: Compiler, kind: str) -> Compiler:
    """``compiler`` as the current hook (if any) wraps it."""
    hook = COMPILER_HOOK.get()
    return compiler if hook is None else hook(compiler, kind)
