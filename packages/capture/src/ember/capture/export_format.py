"""The on-disk form of an :class:`~ember.capture.export_program.ExportedProgram`.

A directory with two files (``docs/export.md`` documents them):

* ``program.json``: ``{"format": "ember.export", "version": 1, "nodes": [...],
  "signature": {...}}``. Each node is ``{"name", "op", "target", "args", "kwargs",
  "meta"}``; a target is a qualified name (``"aten.add.Tensor"``, ``"torch.relu"``,
  ``"torch.nn.functional.batch_norm"``, ``"operator.mul"``, a Tensor method's name for
  ``call_method``) and an argument refers to an earlier node as ``{"node": name}``.
* ``tensors.pt``: ``{"state_dict": {...}, "constants": {...}}`` in torch's zip format,
  loaded with ``weights_only=True``.

Nothing is pickled code: on load every target is resolved again by name through an
allowlist (:data:`NAMESPACES`, ``operator``, :data:`BUILTINS`), and an unknown one is an
:class:`ExportFormatError`.
"""

from __future__ import annotations

import builtins
import json
import math
import operator
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ember.capture.export_program import ExportedProgram, ExportSignature

__all__ = ["BUILTINS", "NAMESPACES", "ExportFormatError", "load", "save"]

FORMAT, VERSION = "ember.export", 1

#: Where a ``call_function`` target may come from, by the prefix its name carries.
NAMESPACES: dict[str, Any] = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.fft": torch.fft,
    "torch.linalg": torch.linalg,
    "torch.special": torch.special,
    "torch.Tensor": torch.Tensor,
    "torch._C._nn": torch._C._nn,
    "math": math,
}
#: Names in those namespaces a graph never calls, refused even when a file names them.
DENIED = frozenset(
    {"load", "save", "compile", "export", "hub", "jit", "from_file", "set_default_device"}
    | {"register_hook", "register_post_accumulate_grad_hook"}  # would call a user function
)
#: The builtins a graph may call (number arithmetic and reading attributes).
BUILTINS = frozenset(
    {"getattr", "len", "abs", "min", "max", "int", "float", "bool", "round", "pow", "divmod", "sum"}
)


class ExportFormatError(ValueError):
    """A saved program that is not in ember's export format, or names an unknown target."""


# -- targets by name -----------------------------------------------------------------------


def target_name(target: Any) -> str:
    """The qualified name a target is saved under.

    >>> target_name(torch.ops.aten.add.Tensor), target_name(torch.nn.functional.relu)
    ('aten.add.Tensor', 'torch.nn.functional.relu')
    >>> target_name(operator.mul), target_name(getattr)
    ('operator.mul', 'builtins.getattr')
    """
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(target)
    name = getattr(target, "__name__", None)
    if name and getattr(operator, name, None) is target:
        return f"operator.{name}"
    if name in BUILTINS and getattr(builtins, name) is target:
        return f"builtins.{name}"
    for prefix, namespace in NAMESPACES.items():
        if name and getattr(namespace, name, None) is target:
            return f"{prefix}.{name}"
    raise ExportFormatError(f"no name to save the graph target {target!r} under")


def resolve(name: str) -> Any:
    """The target saved as ``name``, through the allowlist only.

    >>> resolve("aten.add.Tensor") is torch.ops.aten.add.Tensor
    True
    >>> resolve("os.system")
    Traceback (most recent call last):
    ember.capture.export_format.ExportFormatError: unknown target 'os.system': ...
    """
    prefix, _, last = name.rpartition(".")
    found: Any = None
    if prefix == "operator" and not last.startswith("_"):
        found = getattr(operator, last, None)
    elif prefix == "builtins" and last in BUILTINS:
        found = getattr(builtins, last)
    elif prefix in NAMESPACES and last not in DENIED and not last.startswith("__"):
        found = getattr(NAMESPACES[prefix], last, None)
        found = found if callable(found) and not isinstance(found, type | torch.nn.Module) else None
    if found is None:
        found = _op(name)
    if found is None:
        raise ExportFormatError(
            f"unknown target {name!r}: not a torch op, an allowed torch function, operator.*"
            " or an allowed builtin"
        )
    return found


def _op(name: str) -> Any:
    """``aten.add.Tensor`` (an overload) or ``aten.add`` (a packet) under ``torch.ops``."""
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(p.isidentifier() for p in parts):
        return None
    try:
        found: Any = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(found, parts[2]) if len(parts) == 3 else found
    except (AttributeError, RuntimeError):
        return None


def _checked_call(fn: Any, args: list[Any]) -> Any:
    """``getattr`` reads public attributes only (never ``__class__`` and the like)."""
    if fn is getattr and not (
        len(args) >= 2 and isinstance(args[1], str) and not args[1].startswith("_")
    ):
        raise ExportFormatError(f"getattr of {args[1:2]!r}: only public attributes are read")
    return fn


def _method(name: Any) -> str:
    """A ``call_method`` target: a public method of ``torch.Tensor``."""
    if (
        not isinstance(name, str)
        or name.startswith("_")
        or not callable(getattr(torch.Tensor, name, None))
        or name in DENIED
    ):
        raise ExportFormatError(f"unknown method target {name!r}: not a public torch.Tensor method")
    return name


# -- values ------------------------------------------------------------------------------------

_TAGGED: dict[type, tuple[str, Callable[[Any], Any]]] = {
    torch.dtype: ("dtype", lambda v: str(v).removeprefix("torch.")),
    torch.device: ("device", str),
    torch.layout: ("layout", lambda v: str(v).removeprefix("torch.")),
    torch.memory_format: ("memory_format", lambda v: str(v).removeprefix("torch.")),
}


def encode(value: Any) -> Any:
    """A node argument as JSON (``{"node": name}`` for a node; tags for torch values).

    >>> encode((1, [2.0, None], torch.float32, slice(None, 2)))
    {'tuple': [1, [2.0, None], {'dtype': 'float32'}, {'slice': [None, 2, None]}]}
    """
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, slice):
        return {"slice": [encode(value.start), encode(value.stop), encode(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if type(value) in _TAGGED:
        tag, fn = _TAGGED[type(value)]
        return {tag: fn(value)}
    raise ExportFormatError(f"cannot save the value {value!r} ({type(value).__name__})")


def decode(data: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    """The value :func:`encode` wrote; node references must name earlier nodes."""
    if isinstance(data, list):
        return [decode(v, nodes) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise ExportFormatError(f"bad value {data!r}")
    ((tag, payload),) = data.items()
    if tag == "node":
        if payload not in nodes:
            raise ExportFormatError(f"a node refers to {payload!r}, which is not an earlier node")
        return nodes[payload]
    decoder: Callable[[Any, dict[str, torch.fx.Node]], Any] = _DECODERS.get(tag) or _bad(tag)
    return decoder(payload, nodes)


def _bad(tag: str) -> Callable[[Any, Any], Any]:
    def fail(payload: Any, nodes: Any) -> Any:
        raise ExportFormatError(f"unknown value tag {tag!r}")

    return fail


def _torch_attr(kind: type) -> Callable[[Any, Any], Any]:
    def read(payload: Any, nodes: Any) -> Any:
        value = getattr(torch, str(payload), None)
        if not isinstance(value, kind):
            raise ExportFormatError(f"{payload!r} is not a torch {kind.__name__}")
        return value

    return read


_DECODERS: dict[str, Callable[[Any, dict[str, torch.fx.Node]], Any]] = {
    "float": lambda p, n: float(p) if p in ("inf", "-inf", "nan") else _bad("float")(p, n),
    "tuple": lambda p, n: tuple(decode(v, n) for v in p),
    "dict": lambda p, n: {str(k): decode(v, n) for k, v in p.items()},
    "slice": lambda p, n: slice(*(decode(v, n) for v in p)),
    "ellipsis": lambda p, n: Ellipsis,
    "dtype": _torch_attr(torch.dtype),
    "device": lambda p, n: torch.device(str(p)),
    "layout": _torch_attr(torch.layout),
    "memory_format": _torch_attr(torch.memory_format),
}


# -- node metadata ----------------------------------------------------------------------------


def _qualname(obj: Any) -> str:
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    try:
        return target_name(obj)
    except ExportFormatError:
        return str(obj)


def _tensor_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": [str(n) if not isinstance(n, int) else n for n in value.shape],
        }
    return None


#: How each known meta key is saved (module stacks as strings); others go when JSON-able.
_META: dict[str, Callable[[Any], Any]] = {
    "stack_trace": str,
    "nn_module_stack": lambda v: {str(k): [str(p), _qualname(t)] for k, (p, t) in v.items()},
    "source_fn_stack": lambda v: [[str(entry[0]), _qualname(entry[1])] for entry in v],
    "example_value": _tensor_meta,
}


def encode_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in meta.items():
        try:
            out[key] = _META[key](value) if key in _META else json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue  # not JSON-able (a fake tensor's internals, an object): not saved
    return {k: v for k, v in out.items() if v is not None}


def decode_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    if "nn_module_stack" in out:
        out["nn_module_stack"] = {k: tuple(v) for k, v in out["nn_module_stack"].items()}
    if "source_fn_stack" in out:
        out["source_fn_stack"] = [tuple(v) for v in out["source_fn_stack"]]
    if "example_value" in out:
        out["tensor_meta"] = out.pop("example_value")  # a summary, not a tensor
    return out


# -- the graph ---------------------------------------------------------------------------------


def _node_json(node: torch.fx.Node) -> dict[str, Any]:
    target: Any = node.target
    if node.op == "call_function":
        target = target_name(target)
    elif node.op == "call_method":
        target = _method(target)
    elif node.op not in ("placeholder", "output"):
        raise ExportFormatError(f"cannot save a {node.op} node ({node.name})")
    return {
        "name": node.name,
        "op": node.op,
        "target": target,
        "args": encode(list(node.args)),
        "kwargs": encode(dict(node.kwargs)),
        "meta": encode_meta(node.meta),
    }


def graph_json(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """The node list of ``gm`` as JSON-able dicts."""
    return [_node_json(n) for n in gm.graph.nodes]


# How each node op is made again from its saved target and (decoded) arguments.
_BUILD: dict[str, Callable[[torch.fx.Graph, Any, Any, Any], torch.fx.Node]] = {
    "placeholder": lambda g, target, args, kwargs: g.placeholder(str(target)),
    "output": lambda g, target, args, kwargs: g.output(args[0]),
    "call_function": lambda g, target, args, kwargs: g.call_function(
        _checked_call(resolve(target), args), tuple(args), kwargs
    ),
    "call_method": lambda g, target, args, kwargs: g.call_method(
        _method(target), tuple(args), kwargs
    ),
}


def graph_from_json(nodes: list[dict[str, Any]]) -> torch.fx.GraphModule:
    """The graph :func:`graph_json` wrote, each target resolved through the allowlist."""
    g = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for data in nodes:
        try:
            op, name, target = data["op"], data["name"], data["target"]
            args, kwargs = decode(data["args"], env), decode(data["kwargs"], env)
        except (KeyError, TypeError) as e:
            raise ExportFormatError(f"bad node {data!r}: {e}") from None
        if op not in _BUILD:
            raise ExportFormatError(f"unknown node op {op!r}")
        node = _BUILD[op](g, target, args, kwargs)
        if op != "output":  # fx names a node after its target; an aten trace names it itself
            node._rename(str(name))  # (a name taken already gets a suffix: refused below)
        if node.name != name and op != "output":
            raise ExportFormatError(f"node {name!r} is not a unique name")
        node.meta = decode_meta(data.get("meta", {}))
        env[name] = node
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    gm.graph.lint()
    return gm


def save(program: ExportedProgram, path: str) -> None:
    """Write ``program`` to the directory ``path`` (made if missing)."""
    os.makedirs(path, exist_ok=True)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "torch": torch.__version__,
        "nodes": graph_json(program.graph_module),
        "signature": program.signature.to_json(),
    }
    with open(os.path.join(path, "program.json"), "w") as f:
        json.dump(doc, f, indent=1)
    tensors = {"state_dict": dict(program.state_dict), "constants": dict(program.constants)}
    torch.save(tensors, os.path.join(path, "tensors.pt"))


def load(path: str) -> ExportedProgram:
    """The program :meth:`ExportedProgram.save` wrote to ``path``.

    >>> import tempfile, torch, ember.capture
    >>> ep = ember.capture.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     ep.save(d)
    ...     again = load(d)
    >>> torch.equal(again.module()(torch.ones(1, 2)), ep.module()(torch.ones(1, 2)))
    True
    """
    try:
        with open(os.path.join(path, "program.json")) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ExportFormatError(f"{path}: no readable program.json ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ExportFormatError(f"{path}: not an ember export of version {VERSION}")
    try:
        signature = ExportSignature.from_json(doc["signature"])
    except (KeyError, ValueError) as e:
        raise ExportFormatError(f"{path}: {e}") from None
    gm = graph_from_json(doc.get("nodes", []))
    tensors = torch.load(os.path.join(path, "tensors.pt"), weights_only=True)
    state, constants = tensors.get("state_dict", {}), tensors.get("constants", {})
    _check_names(gm, signature, state, constants)
    return ExportedProgram(gm, signature, state, constants)


def _check_names(
    gm: torch.fx.GraphModule, sig: ExportSignature, state: dict[str, Any], constants: dict[str, Any]
) -> None:
    """The signature names the graph's placeholders, in order, and tensors the file has."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if names != [s.name for s in sig.inputs]:
        raise ExportFormatError("the signature's inputs are not the graph's placeholders")
    for spec in sig.inputs:
        table = constants if spec.kind.value == "constant_tensor" else state
        if spec.kind.value != "user_input" and spec.target not in table:
            raise ExportFormatError(f"no tensor {spec.target!r} for input {spec.name!r}")
