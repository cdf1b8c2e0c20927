"""The graph cache: a graph seen before, in any process, skips lowering and code generation.

A record (``$EMBER_CACHE_DIR/inductor/graphs/<key[:2]>/<key>.json``) holds what
the wrapper needs: its source, the kernels' arguments, the library's cache
key, the constants it binds (encoded by kind) and the output structure. The
key hashes the graph's code, the inputs' and constants' sizes, strides and
dtypes, the compile options, the process-wide settings the graph's meaning
depends on (the default dtype: ``aten.randn([5, 5])`` makes float64 under
``torch.set_default_dtype(torch.float64)``), the torch version and the source
of this package, so any change that could change the result misses. Records are
written atomically and checked on load (the key inside must match); a record
that fails to decode is ignored and rewritten.

>>> encode(torch.float16, {}), decode({"dtype": "float16"}, None)
({'dtype': 'float16'}, torch.float16)
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ember.inductor.cache import CompileOptions, cache_dir
from ember.inductor.wrapper_bind import FAST_CALLS

__all__ = ["Unencodable", "decode", "encode", "graph_key", "load", "save"]


class Unencodable(Exception):
    """A wrapper constant that the graph cache cannot write down: the graph is not cached."""


@functools.cache
def _package_hash() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(here.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _meta(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.layout is not torch.strided:
        raise Unencodable(f"a {t.layout} input")  # (a weight packed by freezing)
    if isinstance(t, torch.Tensor):
        return [list(t.shape), list(t.stride()), str(t.dtype), t.device.type]
    if isinstance(t, float | torch.SymFloat):  # kernels take it as an argument: any value
        return "float"
    if isinstance(t, bool | int):  # a size or count may have been read off it: its value
        return [type(t).__name__, t]
    raise Unencodable(f"a {type(t).__name__} input")


def _symbolic_meta(node: torch.fx.Node, example: Any) -> Any:
    """An input as the graph traced it: symbolic sizes by name (``s0``), never one example's
    values, so that one record serves every size."""
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return ["symint", str(val.node.expr)]
    if isinstance(val, torch.Tensor):
        return [[str(n) for n in val.shape], [str(n) for n in val.stride()], str(val.dtype)]
    return _meta(example)


def symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` was traced with symbolic sizes (a placeholder has a ``SymInt``)."""
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) or (
            isinstance(val, torch.Tensor)
            and any(isinstance(n, torch.SymInt) for n in (*val.shape, *val.stride()))
        ):
            return True
    return False


def graph_key(gm: torch.fx.GraphModule, inputs: Sequence[Any], options: CompileOptions) -> str:
    """The record's name: everything the compiled result depends on (for a graph traced with
    symbolic sizes, those sizes, not the examples')."""
    from ember.aotgraph.store import global_state  # (compile time only: a pack's run skips it)

    constants = [_meta(_fetch(gm, str(n.target))) for n in gm.graph.nodes if n.op == "get_attr"]
    places = gm.graph.find_nodes(op="placeholder")
    metas = (
        [_symbolic_meta(n, t) for n, t in zip(places, inputs, strict=True)]
        if symbolic(gm)
        else [_meta(t) for t in inputs]
    )
    parts = [
        gm.code,
        metas,
        constants,
        options.cxx,
        list(options.cflags),
        global_state(),
        _package_hash(),
        torch.__version__,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _fetch(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def tensor_paths(gm: torch.fx.GraphModule) -> dict[int, str]:
    """id of each tensor reachable as a get_attr of ``gm`` -> its attribute path."""
    out = {id(t): n for n, t in gm.named_parameters(remove_duplicate=False)}
    out |= {id(t): n for n, t in gm.named_buffers(remove_duplicate=False)}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            out.setdefault(id(_fetch(gm, str(node.target))), str(node.target))
    return out


def encode(value: Any, paths: dict[int, str]) -> dict[str, str]:
    """One wrapper constant as JSON (``paths``: tensors of the original graph)."""
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch._ops.OpOverload):
        return {"op": str(value)}
    fast = {id(fn): op for op, fn in FAST_CALLS.items()}.get(id(value))
    if fast is not None:
        return {"fast": str(fast)}
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format | torch.layout):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Tensor) and id(value) in paths:
        return {"attr": paths[id(value)]}
    if callable(value) and _importable(value):
        return {"fn": f"{value.__module__}:{value.__qualname__}"}
    raise Unencodable(f"constant {value!r}")


def decode(item: dict[str, str], gm: torch.fx.GraphModule | None) -> Any:
    """The inverse of :func:`encode`, attributes taken from ``gm``."""
    ((kind, text),) = item.items()
    if kind in ("dtype", "torch"):
        return getattr(torch, text)
    if kind in ("op", "fast"):
        namespace, name, overload = text.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        return op if kind == "op" else FAST_CALLS[op]
    if kind == "float":
        return float(text)
    if kind == "device":
        return torch.device(text)
    if kind == "attr" and gm is not None:
        return _fetch(gm, text)
    if kind == "fn":
        return _import(text)
    raise Unencodable(f"cannot decode {item}")


def _import(text: str) -> Any:
    module, qualname = text.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _importable(fn: Any) -> bool:
    """Whether ``fn`` is found again by its module and qualified name (a number function of
    the wrapper's arithmetic, such as ``ember.aotgraph.numbers.plain_max``)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not isinstance(module, str) or "<" in qualname:
        return False
    try:
        return _import(f"{module}:{qualname}") is fn
    except (ImportError, AttributeError, ValueError):
        return False


def _path(key: str) -> Path:
    return cache_dir() / "graphs" / key[:2] / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The record for ``key``, or None (missing, unreadable or not ours)."""
    from ember.aotgraph.records import read_record  # (light: json and files)

    return read_record(_path(key), key)


def save(key: str, record: dict[str, Any]) -> None:
    """Write ``record`` atomically (temporary file, then rename)."""
    from ember.aotgraph.records import write_record

    write_record(_path(key), key, record)
