"""32-bit indices for kernels over symbolic sizes, chosen at launch when the sizes fit.

A kernel over symbolic sizes is printed with 64-bit indices (``tl.program_id(0)`` widened,
``rindex`` widened): nothing at compile time bounds the sizes it will meet. Beside it the
module gets a 32-bit twin, ``kernelN_i32`` (the same text without the two widenings), and
the launcher runs the twin when every buffer the kernel touches, and its count of points,
stay under ``INDEX32_LIMIT``: then every index the kernel computes (sums of non-negative
terms, each at most an extent) fits in 32 bits, which GPUs compute faster. The size
arguments are Python ints, which Triton itself passes as 32-bit when they fit.

>>> import sympy
>>> from types import SimpleNamespace
>>> ks0 = sympy.Symbol("ks0", integer=True, positive=True)
>>> text = '''
... @triton.jit
... def kernel0(x, ks0):
...     index = tl.program_id(0).to(tl.int64) * 1024 + tl.arange(0, 1024)
...
...
... def launch_kernel0(x, ks0):
...     kernel0[((ks0 + 1023) // 1024,)](x, ks0, num_warps=4)
... '''
>>> buffers = {"x": SimpleNamespace(layout=SimpleNamespace(extent=4 * ks0))}
>>> w = SimpleNamespace(kernel=SimpleNamespace(name="kernel0"), sizes=["ks0"], points=ks0,
...                     prog=SimpleNamespace(buffers=buffers), reads=["x"], writes=[])
>>> print(with_narrow(text, w)[text.index("@"):])  # doctest: +NORMALIZE_WHITESPACE
@triton.jit
def kernel0(x, ks0):
    index = tl.program_id(0).to(tl.int64) * 1024 + tl.arange(0, 1024)
<BLANKLINE>
<BLANKLINE>
@triton.jit
def kernel0_i32(x, ks0):
    index = tl.program_id(0) * 1024 + tl.arange(0, 1024)
<BLANKLINE>
<BLANKLINE>
def launch_kernel0(x, ks0):
    if max(ks0, 4*ks0) < 2147418112:  # 32-bit indices (triton_index32)
        kernel0_i32[((ks0 + 1023) // 1024,)](x, ks0, num_warps=4)
    else:
        kernel0[((ks0 + 1023) // 1024,)](x, ks0, num_warps=4)
<BLANKLINE>
"""

from __future__ import annotations

import re
from typing import Any

import sympy  # type: ignore[import-untyped]

from ember.inductor.symbolic import Unsupported, pyexpr

__all__ = ["INDEX32_LIMIT", "with_narrow"]

# the largest extent with 32-bit indices: a program's block may run up to a block past the
# last point (masked), and blocks are far shorter than 2**16
INDEX32_LIMIT = 2**31 - 2**16
WIDENINGS = (
    ("tl.program_id(0).to(tl.int64)", "tl.program_id(0)"),
    (
        "[None, :].to(tl.int64)",
        "[None, :]",
    ),
)


def with_narrow(text: str, w: Any) -> str:
    """``text`` (a 64-bit kernel of writer ``w``, its split part if any, and its launcher)
    with the 32-bit twin and a launcher that picks one; ``text`` itself when the bound
    cannot be written over the launcher's size arguments."""
    name = w.kernel.name
    bound = _bound(w)
    if bound is None:
        return text
    kernels, mark, launcher = text.partition(f"\n\ndef launch_{name}(")
    head, colon, body = launcher.partition(":\n")
    narrow = kernels
    for wide, plain in WIDENINGS:
        narrow = narrow.replace(wide, plain)
    narrow = re.sub(rf"\bdef {name}(_part)?\(", rf"def {name}\1_i32(", narrow)
    lines = body.rstrip("\n").split("\n")
    calls = [re.sub(rf"\b{name}(_part)?\[", rf"{name}\1_i32[", ln) for ln in lines]
    return "".join(
        [
            kernels,
            narrow,
            mark,
            head,
            colon,
            f"    if {bound} < {INDEX32_LIMIT}:  # 32-bit indices (triton_index32)\n",
            *(f"    {ln}\n" for ln in calls),
            "    else:\n",
            *(f"    {ln}\n" for ln in lines),
        ]
    )


def _bound(w: Any) -> str | None:
    """``max(...)`` of the kernel's points and extents over its size arguments, or None."""
    names = set(w.sizes)
    extents = [w.prog.buffers[n].layout.extent for n in [*w.reads, *w.writes]]
    terms = [e for e in [w.points, *extents] if not sympy.sympify(e).is_Integer]
    if not terms or any(str(s) not in names for e in terms for s in sympy.sympify(e).free_symbols):
        return None
    try:
        printed = list(dict.fromkeys(pyexpr(sympy.sympify(e)) for e in terms))
    except Unsupported:
        return None
    return f"max({', '.join(printed)})" if len(printed) > 1 else printed[0]
