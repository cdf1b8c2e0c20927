"""A JSON form of aten-level ``torch.fx`` graphs that is safe to read back.

aotgraph's disk cache (:mod:`ember.aotgraph.store`) keeps traced graphs in
files a cache folder may share with anything, so reading one back must never
run foreign code: no pickle, no ``eval``. Everything in a graph is written as
plain JSON data and read back through tables:

- a node is ``{"name", "op", "target", "args", "kwargs", "val"}``; ``op`` is
  ``placeholder``, ``get_attr``, ``call_function`` or ``output`` (aotgraph's
  graphs have no others);
- a ``call_function`` target is an aten-style operator (``"aten.mm.default"``,
  looked up in ``torch.ops``) or a Python function named in :func:`functions`,
  an allowlist (``operator``, ``math``, ``torch.sym_*``, the plain-number helpers of
  :mod:`ember.aotgraph.numbers`);
- arguments are JSON numbers, strings, booleans, null and lists; anything else is
  a one-key object naming its kind (``{"node": "mm"}``, ``{"tuple": [...]}``,
  ``{"dtype": "float32"}``, ``{"float": "inf"}``, ``{"slice": [0, null, 2]}``);
- ``meta["val"]`` (the fake value the compilers read) is written as sizes,
  strides, offset, dtype, device and ``requires_grad`` for tensors, and kind and
  example value (``hint``) for symbolic numbers; read back as fresh fake tensors
  and symbols of one ``FakeTensorMode`` (other meta keys are not kept);
- ``get_attr`` tensors (constants ``make_fx`` lifted) are written as their bytes.

A graph holding anything else raises :class:`Unencodable`: the caller does not
cache it. A file that does not decode raises ``ValueError`` (or ``KeyError``,
``TypeError``, ``AttributeError``): the caller ignores it. The round trip keeps
node names, order and the output structure, so the printed code is identical,
and with it the keys of caches (ember.inductor's) that hash ``gm.code``:

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda x: [torch.relu(x)[0] * 2.5, x.sum(dtype=torch.float64)])(torch.ones(3))
>>> data = dump(gm)
>>> data["nodes"][1]  # doctest: +NORMALIZE_WHITESPACE
{'name': 'relu', 'op': 'call_function', 'target': 'aten.relu.default',
 'args': [{'node': 'x_1'}], 'val': {'tensor': [[3], [1], 0, 'float32', 'cpu', False]}}
>>> load(data).code == gm.code
True
"""

from __future__ import annotations

import base64
import builtins
import functools
import keyword
import math
import operator
from collections.abc import Callable
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx
import torch.utils._sympy.functions as tfn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ember.aotgraph import numbers
from ember.aotgraph.trace import QuietShapeEnv, symbolic_float

__all__ = [
    "Fakes",
    "Unencodable",
    "decode_expr",
    "decode_tensor",
    "decode_value",
    "dump",
    "encode_expr",
    "encode_int",
    "encode_meta",
    "encode_tensor",
    "encode_value",
    "fetch",
    "functions",
    "load",
]

JSON = Any  # what json.loads returns
OPS = ("placeholder", "get_attr", "call_function", "output")


class Unencodable(Exception):
    """A part of a graph (or of a cache key) the JSON form cannot hold: do not cache it.

    >>> encode_value(object())
    Traceback (most recent call last):
    ember.aotgraph.serialize.Unencodable: a value of type object
    """


# ---- call_function targets ------------------------------------------------------------------


@functools.cache
def functions() -> dict[str, Callable[..., Any]]:
    """The Python functions a stored graph may call, by name.

    >>> functions()["operator.getitem"] is operator.getitem
    True
    >>> functions()["ember.aotgraph.numbers.plain_max"] is numbers.plain_max
    True
    """
    table: dict[str, Callable[..., Any]] = {}
    for module in (operator, math):
        for name, fn in vars(module).items():
            if callable(fn) and not name.startswith("_") and not isinstance(fn, type):
                table[f"{module.__name__}.{name}"] = fn
    for name in ("abs", "max", "min", "float", "int", "bool", "round", "pow"):
        table[f"builtins.{name}"] = getattr(builtins, name)
    for name in ("sym_max", "sym_min", "sym_float", "sym_int", "sym_not", "sym_sqrt", "sym_ite"):
        table[f"torch.{name}"] = getattr(torch, name)
    for name in ("sym_max", "sym_min", "sym_sqrt", "plain_max", "plain_min"):
        table[f"ember.aotgraph.numbers.{name}"] = getattr(numbers, name)
    return table


@functools.cache
def _function_names() -> dict[Any, str]:
    return {fn: name for name, fn in functions().items()}


def encode_target(target: Any) -> str:
    """An operator as ``"aten.mm.default"``; an allowed function as its table name."""
    if isinstance(target, torch._ops.OpOverload):
        name = f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
        if all(part.isidentifier() for part in name.split(".")):
            return name
    else:
        try:
            return _function_names()[target]
        except (KeyError, TypeError):
            pass
    raise Unencodable(f"call_function target {target!r}")


def decode_target(name: str) -> Callable[..., Any]:
    """The inverse of :func:`encode_target`; ``ValueError`` for anything not found."""
    fn = functions().get(name)
    if fn is not None:
        return fn
    parts = name.split(".")
    if len(parts) != 3 or not all(p.isidentifier() for p in parts) or parts[0] == "higher_order":
        raise ValueError(f"not an operator name: {name!r}")
    namespace, op, overload = parts
    found = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    if not isinstance(found, torch._ops.OpOverload):
        raise ValueError(f"not an operator: {name!r}")
    return found


# ---- argument values --------------------------------------------------------------------------


@functools.cache
def _torch_constants() -> dict[str, dict[str, Any]]:
    """dtype, layout and memory_format objects by name, read from ``torch``'s namespace."""
    kinds = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}
    table: dict[str, dict[str, Any]] = {kind: {} for kind in kinds}
    for value in vars(torch).values():
        for kind, cls in kinds.items():
            if isinstance(value, cls):
                table[kind][str(value).removeprefix("torch.")] = value
    return table


def encode_value(value: Any) -> JSON:
    """One argument as JSON (node references as ``{"node": name}``).

    >>> encode_value([1, (2.0, None), float("-inf"), torch.float16, slice(None, 4)])
    [1, {'tuple': [2.0, None]}, {'float': '-inf'}, {'dtype': 'float16'}, {'slice': [None, 4, None]}]
    """
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, list):  # fx's immutable_list too
        return [encode_value(v) for v in value]
    if kind is tuple:
        return {"tuple": [encode_value(v) for v in value]}
    if kind is slice:
        return {"slice": [encode_value(v) for v in (value.start, value.stop, value.step)]}
    if kind is torch.device:
        return {"device": str(value)}
    for name in ("dtype", "layout", "memory_format"):
        if isinstance(value, getattr(torch, name)):
            return {name: str(value).removeprefix("torch.")}
    raise Unencodable(f"a value of type {kind.__name__}")


def decode_value(data: JSON, nodes: dict[str, torch.fx.Node] | None = None) -> Any:
    """The inverse of :func:`encode_value`; ``nodes`` resolves node references.

    >>> decode_value([{"tuple": [1, {"float": "nan"}]}, {"memory_format": "channels_last"}])
    [(1, nan), torch.channels_last]
    """
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_value(v, nodes) for v in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {data!r}")
    ((kind, item),) = data.items()
    if kind == "node" and nodes is not None:
        return nodes[item]
    if kind == "tuple":
        return tuple(decode_value(v, nodes) for v in item)
    if kind == "slice":
        return slice(*(decode_value(v, nodes) for v in item))
    if kind == "float" and item in ("inf", "-inf", "nan"):
        return float(item)
    if kind == "device":
        return torch.device(item)
    if kind in ("dtype", "layout", "memory_format"):
        return _torch_constants()[kind][item]
    raise ValueError(f"not an encoded value: {data!r}")


# ---- size expressions -------------------------------------------------------------------------

# The sympy classes a size or shape guard of a graph with symbolic sizes may hold, by the
# name a record writes; torch's own integer functions are prefixed (torch has a Mod too).
EXPRESSIONS: dict[str, type] = {
    **{c.__name__: c for c in (sympy.Add, sympy.Mul, sympy.Pow, sympy.And, sympy.Or, sympy.Not)},
    **{
        c.__name__: c
        for c in (
            sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.Max, sympy.Min,
            sympy.Mod,
        )
    },
    **{
        f"torch.{c.__name__}": c
        for c in (
            tfn.FloorDiv, tfn.CeilDiv, tfn.CleanDiv, tfn.ModularIndexing, tfn.PythonMod, tfn.Mod,
            tfn.Max, tfn.Min, tfn.PowByNatural, tfn.Where, tfn.Identity, tfn.LShift, tfn.RShift,
            tfn.IsNonOverlappingAndDenseIndicator,
        )
    },
}  # fmt: skip
_EXPRESSION_NAMES = {c: name for name, c in EXPRESSIONS.items()}


def encode_expr(expr: Any) -> JSON:
    """A sympy expression over size symbols as JSON: an int, a symbol's name, or a list
    ``[class name, *arguments]`` (``["True"]``, ``["False"]`` for the booleans).

    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> encode_expr(sympy.Eq(tfn.FloorDiv(2 * s0 + 1, 3), 4))
    ['Equality', ['torch.FloorDiv', ['Add', 1, ['Mul', 2, 's0']], 3], 4]
    """
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if expr is sympy.true or expr is sympy.false:
        return [str(expr)]
    name = _EXPRESSION_NAMES.get(type(expr))
    if name is None:
        raise Unencodable(f"a size expression of kind {type(expr).__name__}: {expr}")
    return [name, *(encode_expr(a) for a in expr.args)]


def decode_expr(data: JSON, symbols: dict[str, Any]) -> Any:
    """The inverse of :func:`encode_expr`, symbols taken from ``symbols`` (by name): a name
    not there or a class not in :data:`EXPRESSIONS` raises ``ValueError``.

    >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
    >>> data = ["Equality", ["torch.FloorDiv", ["Add", 1, ["Mul", 2, "s0"]], 3], 4]
    >>> decode_expr(data, {"s0": s0})
    Eq(((2*s0 + 1)//3), 4)
    """
    if type(data) is int:
        return sympy.Integer(data)
    if type(data) is str:
        if data not in symbols:
            raise ValueError(f"a size expression over an unknown symbol {data!r}")
        return symbols[data]
    if type(data) is list and data in (["True"], ["False"]):
        return sympy.true if data == ["True"] else sympy.false
    if type(data) is not list or not data or data[0] not in EXPRESSIONS:
        raise ValueError(f"not an encoded size expression: {data!r}")
    return EXPRESSIONS[data[0]](*(decode_expr(a, symbols) for a in data[1:]))


def encode_int(n: Any) -> JSON:
    """A size, stride or offset: an int, or ``{"sym": expression}`` for a ``SymInt``."""
    if isinstance(n, torch.SymInt):
        expr = n.node.expr
        return int(expr) if isinstance(expr, sympy.Integer) else {"sym": encode_expr(expr)}
    return int(n)


# ---- meta["val"] ------------------------------------------------------------------------------

SYMBOLIC = {torch.SymFloat: "float"}  # symbolic number types kept; SymInt/SymBool are not


def encode_meta(value: Any) -> JSON:
    """A node's fake value: tensors by their metadata, symbolic floats by their hint.

    >>> encode_meta((torch.zeros(2, 3).t(), None, 4))
    {'tuple': [{'tensor': [[3, 2], [1, 3], 0, 'float32', 'cpu', False]}, None, 4]}
    """
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise Unencodable("a tensor value that is not strided")
        size, stride = [encode_int(n) for n in value.shape], [encode_int(n) for n in value.stride()]
        offset, dtype = encode_int(value.storage_offset()), str(value.dtype).removeprefix("torch.")
        return {"tensor": [size, stride, offset, dtype, str(value.device), value.requires_grad]}
    if isinstance(value, torch.SymInt):  # a size the graph computes (sym_size, arithmetic)
        return {"symint": encode_int(value)}
    if type(value) in SYMBOLIC:
        hint = value.node.hint
        if type(hint) is not float:
            raise Unencodable(f"a symbolic number without an example value: {value}")
        return {"sym": [SYMBOLIC[type(value)], encode_value(hint)]}
    if isinstance(value, list):
        return [encode_meta(v) for v in value]
    if type(value) is tuple:
        return {"tuple": [encode_meta(v) for v in value]}
    if value is None or type(value) in (bool, int, float):
        return encode_value(value)
    raise Unencodable(f"a node value of type {type(value).__name__}")


class Fakes:
    """Builds the fake values of the graphs of one record, all in one ``FakeTensorMode``.

    >>> fakes = Fakes()
    >>> t = fakes.decode({"tensor": [[2, 3], [1, 2], 0, "float32", "cpu", False]})
    >>> type(t).__name__, t.shape, t.stride(), t.fake_mode is fakes.mode
    ('FakeTensor', torch.Size([2, 3]), (1, 2), True)
    """

    def __init__(self, mode: FakeTensorMode | None = None) -> None:
        # a graph with symbolic sizes: its own mode, whose ShapeEnv holds the size symbols
        self.mode = mode or FakeTensorMode(
            allow_non_fake_inputs=True, shape_env=QuietShapeEnv(), static_shapes=True
        )
        assert self.mode.shape_env is not None
        self.env = self.mode.shape_env
        self.symbols = {s.name: s for s in self.env.backed_var_to_val} if mode else {}
        self._symbols = 0

    def decode(self, data: JSON) -> Any:
        """The inverse of :func:`encode_meta`: fresh fake tensors and symbols."""
        if type(data) is dict and "tensor" in data:
            size, stride, offset, *rest = data["tensor"]
            sizes, strides = [*map(self.size, size)], [*map(self.size, stride)]
            return self.tensor(sizes, strides, self.size(offset), *rest)
        if type(data) is dict and "symint" in data:
            return self.size(data["symint"])
        if type(data) is dict and "sym" in data:
            kind, hint = data["sym"]
            if kind != "float":
                raise ValueError(f"not a symbolic number kind: {kind!r}")
            return self.symbolic_float(float(decode_value(hint)))
        if type(data) is list:
            return [self.decode(v) for v in data]
        if type(data) is dict and "tuple" in data:
            return tuple(self.decode(v) for v in data["tuple"])
        return decode_value(data)

    def size(self, data: JSON) -> Any:
        """An int, or a ``SymInt`` of this mode's ShapeEnv for ``{"sym": expression}`` (its
        example value from the symbols' own: the ShapeEnv records no guard)."""
        if type(data) is not dict:
            return int(data)
        expr = decode_expr(data["sym"], self.symbols)
        hint = expr.xreplace(self.env.backed_var_to_val)
        if not isinstance(hint, sympy.Integer):
            raise ValueError(f"a size without an example value: {expr}")
        return self.env.create_symintnode(expr, hint=int(hint))

    def tensor(
        self, size: list[Any], stride: list[Any], offset: Any, dtype: str, device: str, grad: bool
    ) -> torch.Tensor:
        """A fake tensor of this mode with these sizes, strides, offset, dtype and device.

        Built directly on a meta tensor: ``torch.empty_strided`` under the mode
        costs 130 us a tensor, this 20 us (a loaded graph of 1000 nodes: 0.13 s -> 0.02 s).
        """
        kind = _torch_constants()["dtype"][dtype]
        if isinstance(offset, torch.SymInt) or offset:  # (bool() of a SymInt would guard)
            extent = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
            base = torch.empty(extent, dtype=kind, device="meta")
            elem = base.as_strided(size, stride, offset)
        else:
            elem = torch.empty_strided(size, stride, dtype=kind, device="meta")
        fake = FakeTensor(self.mode, elem, torch.device(device))
        return fake.requires_grad_(True) if grad else fake

    def symbolic_float(self, hint: float) -> torch.SymFloat | float:
        """A fresh symbolic float with ``hint`` as its example value."""
        self._symbols += 1
        return symbolic_float(self.env, hint, 1000 + self._symbols)


# ---- get_attr constants -----------------------------------------------------------------------


def encode_tensor(t: Any) -> JSON:
    """A real constant tensor as dtype, sizes, strides and its bytes (base64).

    >>> encode_tensor(torch.tensor([1.0, 2.0]))
    {'dtype': 'float32', 'size': [2], 'stride': [1], 'data': 'AACAPwAAAEA='}
    """
    plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
    if not plain or t.device.type != "cpu" or t.requires_grad or t.is_conj() or t.is_neg():
        raise Unencodable(f"a constant {type(t).__name__} that is not a plain CPU tensor")
    if t.is_quantized:
        raise Unencodable("a quantized constant")
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    dtype = str(t.dtype).removeprefix("torch.")
    data = base64.b64encode(flat.numpy().tobytes()).decode()
    return {"dtype": dtype, "size": list(t.shape), "stride": list(t.stride()), "data": data}


def decode_tensor(data: JSON) -> torch.Tensor:
    """The inverse of :func:`encode_tensor`.

    >>> decode_tensor(encode_tensor(torch.arange(6).view(2, 3).t()))
    tensor([[0, 3],
            [1, 4],
            [2, 5]])
    """
    dtype = _torch_constants()["dtype"][data["dtype"]]
    raw = bytearray(base64.b64decode(data["data"], validate=True))
    size = [int(n) for n in data["size"]]
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    dense = flat.view(dtype).reshape(size)
    out = torch.empty_strided(size, [int(s) for s in data["stride"]], dtype=dtype)
    return out.copy_(dense)


# ---- graphs -----------------------------------------------------------------------------------


def fetch(gm: torch.nn.Module, target: str) -> Any:
    """The attribute ``target`` (dotted) of ``gm``.

    >>> fetch(torch.nn.Linear(2, 3), "weight").shape
    torch.Size([3, 2])
    """
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _encode_node(node: torch.fx.Node) -> JSON:
    if node.op not in OPS or node.type is not None:
        raise Unencodable(f"a {node.op} node {node.name} (type {node.type})")
    if node.op == "call_function":
        target = encode_target(node.target)
    elif isinstance(node.target, str):
        target = node.target
    else:
        raise Unencodable(f"node {node.name}: target {node.target!r}")
    out: dict[str, JSON] = {"name": node.name, "op": node.op, "target": target}
    out["args"] = [encode_value(a) for a in node.args]
    if node.kwargs:
        out["kwargs"] = {k: encode_value(v) for k, v in node.kwargs.items()}
    if "val" in node.meta:
        out["val"] = encode_meta(node.meta["val"])
    return out


def dump(gm: torch.fx.GraphModule) -> JSON:
    """``gm``'s graph, its ``get_attr`` tensors and its class name as JSON data.

    Raises :class:`Unencodable` for a graph this form cannot hold (a node kind,
    target, argument or value outside the tables, a graph with its own codegen).
    """
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        raise Unencodable(f"a graph with {type(gm.graph._codegen).__name__}")
    nodes = [_encode_node(n) for n in gm.graph.nodes]
    constants = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        constants[str(node.target)] = encode_tensor(fetch(gm, str(node.target)))
    name = type(gm).__name__  # Forward, Backward; a class named after a lambda is not kept
    name = name if name.isidentifier() else "GraphModule"
    return {"class": name, "nodes": nodes, "constants": constants}


def _identifier(text: Any, dotted: bool = False) -> str:
    """``text`` if it is a name the generated code may hold (it is executed), else ValueError."""
    parts = text.split(".") if dotted and type(text) is str else [text]
    if not all(type(p) is str and p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise ValueError(f"not a name: {text!r}")
    return str(text)


def _decode_node(
    graph: torch.fx.Graph, data: JSON, env: dict[str, torch.fx.Node], fakes: Fakes
) -> None:
    op, name, target = data["op"], _identifier(data["name"]), data["target"]
    if op not in OPS:
        raise ValueError(f"not an encoded node: {data!r}")
    if op == "call_function":
        fn: Any = decode_target(target)
    else:  # placeholder and get_attr targets are written into the code as they are
        fn = _identifier(target, dotted=op == "get_attr")
    args = tuple(decode_value(a, env) for a in data["args"])
    kwargs = {_identifier(k): decode_value(v, env) for k, v in data.get("kwargs", {}).items()}
    node = graph.create_node(op, fn, args, kwargs, name=name)
    if node.name != name:
        raise ValueError(f"node name {name!r} came back as {node.name!r}")
    if "val" in data:
        node.meta["val"] = fakes.decode(data["val"])
    env[name] = node


def load(data: JSON, fakes: Fakes | None = None) -> torch.fx.GraphModule:
    """The graph module :func:`dump` wrote; node values are fake tensors of ``fakes``.

    Raises ``ValueError`` (or ``KeyError``, ``TypeError``, ``AttributeError``) for
    data that is not such a graph.
    """
    fakes = fakes or Fakes()
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for item in data["nodes"]:
        _decode_node(graph, item, env, fakes)
    root = torch.nn.Module()
    for target, tensor in data["constants"].items():
        root.register_buffer(_identifier(target), decode_tensor(tensor))
    graph.lint()
    return torch.fx.GraphModule(root, graph, class_name=_identifier(data["class"]))
