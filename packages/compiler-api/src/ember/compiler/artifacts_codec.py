"""Values, guards and captured graphs as JSON, for portable packs (``artifacts.py``).

Objects are written by what names them in any process, never by ``id``: a class or a
function by module and qualified name (checked to resolve back to the very object), an
ember dataclass (sources, guards, specs) field by field, a tensor constant in torch's own
format (read back with ``weights_only=True``). The object of an identity guard that has
no such name (the user's model, one of its submodules) is written as "re-resolve": the
pack's loader fetches it again from the new frame by the guard's source
(``self.layers[0]``), so the entry serves that process's objects. Anything else cannot be
written (:class:`Unpackable`): its entry is left out of the pack, with the reason.

>>> from ember.guards import Attr, Local
>>> data = encode(Attr(Local("self"), "scale"))
>>> decode(data) == Attr(Local("self"), "scale")
True
>>> decode(encode((torch.float16, float("inf"), slice(1, None), {"k": [1, None]})))
(torch.float16, inf, slice(1, None, None), {'k': [1, None]})
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import importlib
import io
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree

from ember.capture.prebuilt import code_key
from ember.guards import Attr, Guard, GuardKind, Source, WeakIdentity, dict_keys, length, type_match

__all__ = [
    "Unpackable",
    "decode",
    "decode_graph",
    "decode_guard",
    "encode",
    "encode_graph",
    "encode_guard",
    "set_attribute",
]

JSON = Any
# the dataclasses a pack may rebuild (running their constructors): ember's own
_DATACLASS_MODULES = ("ember.",)


class Unpackable(Exception):
    """A value a pack cannot name in another process: its entry is left out."""


def resolve(module: str, qualname: str) -> Any:
    """The object ``module:qualname`` names (importing the module; a C submodule such as
    ``torch._C._nn`` is reached as an attribute of its parent)."""
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        parent, _, last = module.rpartition(".")
        obj = getattr(importlib.import_module(parent), last)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _name(obj: Any) -> JSON | None:
    """``{"name": "module:qualname"}`` if that finds ``obj`` again, else None."""
    if isinstance(obj, types.ModuleType):
        return {"module": obj.__name__}
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return None
    if module == "builtins" and isinstance(obj, type) and obj in _TYPES:  # function, code
        return {"name": f"types:{_TYPES[obj]}"}
    # torch's C functions say "_VariableFunctionsClass.cos": the module has them by name
    for name in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
        if not isinstance(name, str) or "<" in name:
            continue
        try:
            if resolve(module, name) is obj:
                return {"name": f"{module}:{name}"}
        except (ImportError, AttributeError, ValueError):
            continue
    return None


# the interpreter's own types that builtins does not name (``types.FunctionType``)
_TYPES = {v: k for k, v in vars(types).items() if isinstance(v, type) and k[0].isupper()}


def _tensor(t: torch.Tensor) -> JSON:
    if isinstance(t, torch.nn.Parameter) or type(t) is not torch.Tensor:
        raise Unpackable(f"a {type(t).__name__} constant (only plain tensors are copied)")
    buffer = io.BytesIO()
    torch.save(t.detach().clone(), buffer)
    return {"tensor": base64.b64encode(buffer.getvalue()).decode()}


def _dataclass(obj: Any) -> JSON:
    cls = type(obj)
    if not cls.__module__.startswith(_DATACLASS_MODULES) or _name(cls) is None:
        raise Unpackable(f"a {cls.__qualname__} object")
    fields = {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return {"dc": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}


# exact type -> its JSON form (containers keep their kind: a tuple is not a list)
_BY_TYPE: dict[type, Callable[[Any], JSON]] = {
    type(None): lambda v: v,
    bool: lambda v: v,
    int: lambda v: v,
    str: lambda v: v,
    float: lambda v: {"float": repr(v)},
    tuple: lambda v: {"tuple": [encode(x) for x in v]},
    list: lambda v: {"list": [encode(x) for x in v]},
    dict: lambda v: {"dict": [[encode(k), encode(x)] for k, x in v.items()]},
    frozenset: lambda v: {"frozenset": [encode(x) for x in sorted(v, key=repr)]},
    slice: lambda v: {"slice": [encode(v.start), encode(v.stop), encode(v.step)]},
    type(Ellipsis): lambda v: {"ellipsis": None},
    torch.Size: lambda v: {"size": list(v)},
    torch.dtype: lambda v: {"torch": str(v).removeprefix("torch.")},
    torch.layout: lambda v: {"torch": str(v).removeprefix("torch.")},
    torch.memory_format: lambda v: {"torch": str(v).removeprefix("torch.")},
    torch.device: lambda v: {"device": str(v)},
    torch.Tensor: _tensor,
    torch._ops.OpOverload: lambda v: {"op": str(v)},
    pytree.TreeSpec: lambda v: {"treespec": pytree.treespec_dumps(v)},
}
# fx keeps a node's arguments in immutable containers: written as the plain ones
_BY_TYPE[immutable_list] = _BY_TYPE[list]
_BY_TYPE[immutable_dict] = _BY_TYPE[dict]


def encode(value: Any) -> JSON:
    """``value`` as JSON, or :class:`Unpackable`."""
    rule = _BY_TYPE.get(type(value))
    if rule is not None:
        return rule(value)
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, enum.Enum) and (named := _name(type(value))) is not None:
        return {"enum": named["name"], "member": value.name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass(value)
    if isinstance(value, WeakIdentity):
        return encode_identity(value.get())
    named = _name(value)
    if named is None:
        raise Unpackable(f"{type(value).__name__} {value!r:.60}")
    return named


def encode_identity(obj: Any) -> JSON:
    """The object of an identity guard: by name, else re-resolved by the guard's source. A
    function or code object also carries its code's key, checked where it is found again:
    a function patched in the new process is not the one the graph was captured from."""
    found = _name(obj) or {"reresolve": None}
    code = obj if isinstance(obj, types.CodeType) else getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType) and isinstance(obj, types.CodeType | types.FunctionType):
        found["code"] = code_key(code)
    return found


def _same_code(obj: Any, data: JSON) -> Any:
    """``obj``, if its code is the one ``data`` was written with (else ValueError)."""
    key = data.get("code")
    if key is not None:
        code = obj if isinstance(obj, types.CodeType) else getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType) or code_key(code) != key:
            raise ValueError(f"{obj!r:.60} is not the code the pack was made with")
    return obj


def _op(text: str) -> Any:
    namespace, name, overload = text.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _load_tensor(text: str) -> torch.Tensor:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)  # type: ignore[no-any-return]


@functools.cache
def _dataclass_of(path: str) -> tuple[Any, frozenset[str]]:
    """The ember dataclass ``path`` names and its ``__init__`` fields (a pack's guards
    rebuild hundreds of sources and specs of a few classes)."""
    module, qualname = path.split(":")
    if not module.startswith(_DATACLASS_MODULES):
        raise ValueError(f"pack names a class outside ember: {path}")
    cls = resolve(module, qualname)
    return cls, frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def _make_dataclass(path: str, fields: dict[str, JSON], ctx: _Context) -> Any:
    cls, init = _dataclass_of(path)
    values = {k: decode(v, ctx) for k, v in fields.items()}
    obj = cls(**{k: v for k, v in values.items() if k in init})
    for k, v in values.items():
        if k not in init:
            object.__setattr__(obj, k, v)
    return obj


@dataclasses.dataclass(frozen=True, slots=True)
class _Context:
    """What decoding needs besides the data: graph nodes by name, and how to fetch a
    re-resolved object (None: re-resolving is an error here)."""

    nodes: dict[str, torch.fx.Node] = dataclasses.field(default_factory=dict)
    reresolve: Callable[[], Any] | None = None


def _reresolved(ctx: _Context) -> Any:
    if ctx.reresolve is None:
        raise ValueError("a re-resolved object outside an identity guard")
    return ctx.reresolve()


# tag -> how to read it back
_BY_TAG: dict[str, Callable[[Any, Any, _Context], Any]] = {
    "float": lambda v, d, c: float(v),
    "tuple": lambda v, d, c: tuple(decode(x, c) for x in v),
    "list": lambda v, d, c: [decode(x, c) for x in v],
    "dict": lambda v, d, c: {decode(k, c): decode(x, c) for k, x in v},
    "frozenset": lambda v, d, c: frozenset(decode(x, c) for x in v),
    "slice": lambda v, d, c: slice(*(decode(x, c) for x in v)),
    "ellipsis": lambda v, d, c: Ellipsis,
    "size": lambda v, d, c: torch.Size(v),
    "torch": lambda v, d, c: getattr(torch, v),
    "device": lambda v, d, c: torch.device(v),
    "tensor": lambda v, d, c: _load_tensor(v),
    "op": lambda v, d, c: _op(v),
    "treespec": lambda v, d, c: pytree.treespec_loads(v),
    "node": lambda v, d, c: c.nodes[v],
    "enum": lambda v, d, c: getattr(resolve(*v.split(":")), d["member"]),
    "dc": lambda v, d, c: _make_dataclass(v, d["fields"], c),
    "module": lambda v, d, c: importlib.import_module(v),
    "name": lambda v, d, c: _same_code(resolve(*v.split(":")), d),
    "reresolve": lambda v, d, c: _same_code(_reresolved(c), d),
}


def decode(data: JSON, ctx: _Context | None = None) -> Any:
    """The value :func:`encode` wrote (importing what it names)."""
    if not isinstance(data, dict):
        return data
    tag = next(iter(data))
    return _BY_TAG[tag](data[tag], data, ctx or _Context())


def _pins(source: Source, obj: Any) -> list[Guard]:
    """What an identity also held, checked on the object re-resolved in its place: its class
    and, for a module, its children's names (a ModuleList of another length); for a list or
    tuple its length, for a dict its keys."""
    pins = [type_match(source, obj)]
    if isinstance(obj, torch.nn.Module):
        pins.append(dict_keys(Attr(source, "_modules"), obj._modules))
    elif type(obj) in (list, tuple):
        pins.append(length(source, obj))
    elif type(obj) is dict:
        pins.append(dict_keys(source, obj))
    return pins


def encode_guard(guard: Guard) -> JSON:
    """One guard: its source, kind, expected value (identities by name, or re-resolved with
    the guards that pin what the identity implied)."""
    data = {"source": encode(guard.source), "kind": guard.kind.name, "where": guard.where}
    if guard.kind is not GuardKind.ID_MATCH:
        return {**data, "expected": encode(guard.expected)}
    obj = guard.expected.get() if isinstance(guard.expected, WeakIdentity) else guard.expected
    expected = encode_identity(obj)
    if "reresolve" in expected and not isinstance(obj, types.CodeType):  # code: by its key
        data["pins"] = [encode_guard(p) for p in _pins(guard.source, obj)]
    return {**data, "expected": expected}


def decode_guard(data: JSON, fetch: Callable[[Any], Any]) -> list[Guard]:
    """The guard :func:`encode_guard` wrote, with its pins; ``fetch(source)`` gives a
    re-resolved object (the current frame's value there), held weakly as the guard's own
    would be."""
    source = decode(data["source"])
    kind = GuardKind[data["kind"]]

    def again() -> Any:
        return fetch(source)

    expected = decode(data["expected"], _Context(reresolve=again))
    if kind is GuardKind.ID_MATCH:  # held weakly, as the guard's own object was
        expected = WeakIdentity.of(expected) or expected
    pins = [g for pin in data.get("pins", ()) for g in decode_guard(pin, fetch)]
    return [Guard(source, kind, expected, data["where"]), *pins]


def encode_graph(gm: torch.fx.GraphModule) -> JSON:
    """A captured graph: its nodes and its tensor constants (no submodules)."""
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        raise Unpackable("a graph with its own code generator")
    nodes, attrs = [], {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise Unpackable("a graph that calls a submodule")
        target = encode(node.target) if node.op == "call_function" else node.target
        if node.op == "get_attr":
            attrs[node.target] = encode(_attr(gm, node.target))
        nodes.append([node.name, node.op, target, encode(node.args), encode(node.kwargs)])
    return {"nodes": nodes, "attrs": attrs}


def _attr(gm: torch.nn.Module, path: str) -> Any:
    obj: Any = gm
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def decode_graph(data: JSON) -> torch.fx.GraphModule:
    """The graph :func:`encode_graph` wrote (same node names, so the same ``gm.code``)."""
    graph = torch.fx.Graph()
    ctx = _Context()
    for name, op, target, args, kwargs in data["nodes"]:
        fn = decode(target) if op == "call_function" else target
        node = graph.create_node(op, fn, decode(args, ctx), decode(kwargs, ctx), name=name)
        if node.name != name:
            raise ValueError(f"node {name!r} came back as {node.name!r}")
        ctx.nodes[name] = node
    root = torch.nn.Module()
    for path, value in data["attrs"].items():
        set_attribute(root, path, decode(value))
    return torch.fx.GraphModule(root, graph)


def set_attribute(root: torch.nn.Module, path: str, value: Any) -> None:
    """``root.a.b = value`` for ``path`` ``"a.b"``, making the submodules on the way.

    >>> m = torch.nn.Module(); set_attribute(m, "a.b", torch.ones(1)); m.a.b
    tensor([1.])
    """
    *parents, last = path.split(".")
    owner = root
    for part in parents:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    setattr(owner, last, value)
