"""Write a failing graph as a standalone script, ``repro.py``, that uses public APIs only.

The script holds the graph's code (as an ``nn.Module`` that ``torch.fx.symbolic_trace``
turns back into the graph), its inputs (random with the saved shapes, strides and dtypes,
or the saved values), and the call that fails: the compiler on the graph, then the
compiled graph on the inputs (compared with eager for an accuracy failure).

>>> import torch
>>> from ember.compiler.minifier import Check
>>> gm = torch.fx.symbolic_trace(lambda x: torch.relu(x))
>>> text = script(gm, [torch.zeros(2, 3)], compiler_ref("eager"), Check("raises", TypeError))
>>> print(text, end="")
# ember repro: the compiler raises TypeError
import torch
import ember.compiler
class Repro(torch.nn.Module):
    def forward(self, x):
        relu = torch.relu(x);  x = None
        return relu
args = [torch.empty_strided((2, 3), (3, 1), dtype=torch.float32).normal_()]
gm = torch.fx.symbolic_trace(Repro())
compiled = ember.compiler.lookup_backend('eager')(gm, list(args))
compiled(*args)
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ember.compiler.minifier import Check


def inputs_file(script_name: str) -> str:
    """Where the input values of a script are saved, next to it.

    >>> inputs_file("repro.py")
    'repro_inputs.pt'
    """
    return script_name.removesuffix(".py") + "_inputs.pt"


# How fx's generated code names a few objects, and the import that defines each.
_FX_GLOBALS = {
    "inf": "from math import inf",
    "nan": "from math import nan",
    "device": "from torch import device",
    "NoneType": "NoneType = type(None)",
}


@dataclass(frozen=True, slots=True)
class CompilerRef:
    """How a script reaches a compiler: its import lines and an expression.

    >>> compiler_ref("inductor", {"cflags": ["-O1"]}).expr
    "functools.partial(ember.compiler.lookup_backend('inductor'), options={'cflags': ['-O1']})"
    """

    imports: tuple[str, ...]
    expr: str


def compiler_ref(backend: Any, options: dict[str, Any] | None = None) -> CompilerRef | None:
    """The reference of a backend as ``compile()`` was given it (a name or a callable)."""
    if isinstance(backend, str):
        base = CompilerRef(
            ("import ember.compiler",), f"ember.compiler.lookup_backend({backend!r})"
        )
    else:
        found = reference(backend)
        if found is None:
            return None
        base = found
    if not options:
        return base
    return CompilerRef(
        ("import functools", *base.imports), f"functools.partial({base.expr}, options={options!r})"
    )


def reference(fn: Any) -> CompilerRef | None:
    """How a script imports ``fn``: a module-level function or class, or a
    ``functools.partial`` of one; else its source, copied into the script (a function of
    ``__main__``); None when none of these works (a closure, a lambda). A wrapper that
    names what it wraps (``__wrapped__``, as the compile report's ``noting`` does) stands
    for the wrapped function."""
    fn = inspect.unwrap(fn)
    if isinstance(fn, functools.partial):
        inner = reference(fn.func)
        if inner is None or fn.args:
            return None
        kw = "".join(f", {k}={v!r}" for k, v in fn.keywords.items())
        return CompilerRef(
            ("import functools", *inner.imports), f"functools.partial({inner.expr}{kw})"
        )
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or "." in qualname:
        return _source(fn)
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except ImportError:
        return None
    if found is not fn:
        return None
    return CompilerRef((*_path_lines(module), f"from {module} import {qualname}"), qualname)


def _source(fn: Any) -> CompilerRef | None:
    """``fn``'s own source, for a function no script can import (the user's script's
    ``__main__``, a local function) that needs no closure; None when it has none."""
    if not isinstance(fn, types.FunctionType) or fn.__closure__ or fn.__name__ == "<lambda>":
        return None
    try:
        source = textwrap.dedent(inspect.getsource(fn)).strip()
    except (OSError, TypeError):
        return None
    return CompilerRef((source,), fn.__name__)


def _path_lines(module: str) -> tuple[str, ...]:
    """The ``sys.path`` line a script needs to import ``module`` (none for installed ones)."""
    top = sys.modules.get(module.split(".")[0])
    file = getattr(top, "__file__", None)
    if file is None or module.split(".")[0] in ("ember", "torch") or "-packages" in file:
        return ()
    root = Path(file).parent if not file.endswith("__init__.py") else Path(file).parent.parent
    return ("import sys", f"sys.path.insert(0, {str(root)!r})")


def input_expr(value: Any) -> str:
    """A Python expression for an input like ``value``: random, same metadata.

    >>> input_expr(torch.zeros(2, 2, dtype=torch.int64).t())
    'torch.empty_strided((2, 2), (1, 2), dtype=torch.int64).random_(0, 8)'
    """
    if not isinstance(value, torch.Tensor):
        return repr(value)
    fill = _FILLS[_kind(value.dtype)]
    dev = "" if value.device.type == "cpu" else f", device={str(value.device)!r}"
    made = f"torch.empty_strided({tuple(value.shape)}, {value.stride()}, dtype={value.dtype}{dev})"
    grad = ".requires_grad_()" if value.requires_grad else ""
    return f"{made}.{fill}{grad}"


_FILLS = {"float": "normal_()", "bool": "random_(0, 2)", "int": "random_(0, 8)"}


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point or dtype.is_complex:
        return "float"
    return "bool" if dtype == torch.bool else "int"


def _code(gm: torch.fx.GraphModule) -> tuple[list[str], list[str]]:
    """The import lines and the ``forward`` lines of ``gm``'s generated code."""
    py = gm.graph.python_code(root_module="self")
    lines = [line for line in py.src.splitlines() if line.strip()]
    imports = ["import torch"]
    for name, obj in py.globals.items():
        if name == "torch" or not re.search(rf"\b{re.escape(name)}\b", py.src):
            continue
        ref = None if name in _FX_GLOBALS else reference(obj)
        line = _FX_GLOBALS.get(name) or (ref and f"{ref.imports[-1]} as {name}")
        imports.append(line or f"# cannot import {name} = {obj!r}")
    return imports, lines


def script(
    gm: torch.fx.GraphModule,
    args: list[Any],
    ref: CompilerRef | None,
    check: Check,
    saved: str = "",
    note: str = "",
) -> str:
    """The text of a standalone script in which ``ref``'s compiler fails on ``gm``.

    ``saved``: the script's file name, when its inputs are loaded from the file
    :func:`inputs_file` names next to it (written by :func:`write`); otherwise they are
    random with the same metadata.
    """
    imports, forward = _code(gm)
    header = [f"# ember repro: the compiler {check.describe()}"] + [
        f"# {n}" for n in note.splitlines()
    ]
    where = ref.imports if ref else ()
    expr = ref.expr if ref else "None  # the compiler cannot be imported: put it here"
    lines = [*header, *dict.fromkeys([*imports, *where])]
    lines += ["class Repro(torch.nn.Module):", *("    " + line for line in forward)]
    if saved:
        lines += [
            "import pathlib",
            f"args = torch.load(pathlib.Path(__file__).with_name({inputs_file(saved)!r}))",
        ]
    else:
        lines.append(f"args = [{', '.join(input_expr(a) for a in args)}]")
    lines.append("gm = torch.fx.symbolic_trace(Repro())")
    lines += _CALLS[check.kind](expr)
    return "\n".join(lines) + "\n"


_CALLS: dict[str, Callable[[str], list[str]]] = {
    "raises": lambda expr: [f"compiled = {expr}(gm, list(args))", "compiled(*args)"],
    "accuracy": lambda expr: [
        "from ember.compiler.testing import assert_same",
        "expected = gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])",
        f"got = {expr}(gm, list(args))(*args)",
        "assert_same(list(got), list(expected))  # AssertionError: not within tolerance",
    ],
}


def write(directory: Path, name: str, text: str, args: list[Any] | None = None) -> Path:
    """Write ``text`` to ``directory/name`` (and the input values, when given)."""
    directory.mkdir(parents=True, exist_ok=True)
    if args is not None:
        plain = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args]  # fmt: skip
        torch.save(plain, directory / inputs_file(name))
    path = directory / name
    path.write_text(text)
    return path
