"""aotgraph's disk cache: a graph traced before, in any process, skips tracing.

Tracing (``analyze``, ``make_fx`` twice, functionalization, partitioning) is
most of a warm compile: the caller's compilers have caches of their own (the
inductor backend's graph cache loads a compiled library in milliseconds), but
they can only hit once they are handed the same graphs again. So
:meth:`~ember.aotgraph.api.AOTCompiled.build` asks :func:`cached` first:

    key   = record_key(lifted, inputs, grad, settings)  # None: this graph is not cached
    found = load(key)                                   # $EMBER_CACHE_DIR/aotgraph/ab/abcd....json
    found ? decode(found) : save(key, encode(trace()))  # a Traced either way

What a record holds is a :class:`Traced`: the graphs the compilers get
(written with :mod:`ember.aotgraph.serialize`: plain JSON, read back without
running anything from the file), the :class:`~ember.aotgraph.trace.Signature`
and what the runtime needs (mutated inputs, saved values to clone or that are
numbers), and the partition's saved names and sizes, so ``AOTCompiled.partition``
is there after a hit; ``AOTCompiled.joint`` is not (the joint graph is not kept).
A trace that needed a float input's value is recorded too (``"specialized"``),
so the next process goes straight to the version with floats as constants.

The key hashes everything the result depends on: the input graph's code, its
``call_function`` targets (torch's, ``operator``'s, ``math``'s, builtins and
ember.aotgraph's number helpers; a graph calling anything else, or holding
``call_module`` nodes, is not cached) and constant tensors (values
included), each input's size, stride, offset, dtype, device, ``requires_grad``
and aliasing, which inputs are symbolic floats, the constant inputs' values,
grad mode, global state (default dtype, autocast, deterministic algorithms),
the partitioner's name, the decomposition table (each entry's op and function;
a function outside torch also by the source file it is defined in), and the
versions of torch, Python and this package's source. Records are written
atomically and checked on load; a record that is unreadable, foreign or has
another key inside is ignored and written again.

``aot_compile(..., cache=False)`` or ``EMBER_AOT_CACHE=0`` turns the cache off.

>>> import torch
>>> from ember.aotgraph.trace import Lifted
>>> gm = torch.fx.symbolic_trace(lambda x: x.sin())
>>> x = torch.randn(3)
>>> key = record_key(Lifted.of(gm, [x]), [x], True, settings_key("default", {}))
>>> len(key), key == record_key(Lifted.of(gm, [x]), [x], False, settings_key("default", {}))
(64, False)
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ember.aotgraph import check, serialize, settings
from ember.aotgraph.partition import Partition
from ember.aotgraph.records import TOUCHED, read_record, write_record
from ember.aotgraph.serialize import JSON, Unencodable, encode_value
from ember.aotgraph.trace import Lifted, Output, Signature, Specialized, TensorMeta

__all__ = [
    "TOUCHED",
    "Traced",
    "cache_dir",
    "cached",
    "decode",
    "enabled",
    "encode",
    "global_state",
    "load",
    "read_record",
    "record_key",
    "save",
    "settings_key",
    "write_record",
]

# Bump when the record layout changes (the package hash changes with any edit anyway).
RECORD_VERSION = 6

# Modules whose functions a cached input graph may call: identified by name, fixed by torch's
# and Python's versions, which the key holds (and ember.aotgraph's, by the package hash).
SAFE_ROOTS = frozenset({"torch", "operator", "_operator", "math", "builtins"})


@dataclass(frozen=True, slots=True)
class Traced:
    """What tracing produced for one path, before the compilers run: what a record holds.

    ``forward`` is the inference graph, or the partition's forward graph when training.

    >>> from ember.aotgraph.trace import Lifted, analyze
    >>> gm = torch.fx.symbolic_trace(lambda x: x * 2)
    >>> x = torch.ones(2)
    >>> sig = analyze(Lifted.of(gm, [x]), [x], grad=False)
    >>> Traced(sig, (), gm).partition is None
    True
    """

    signature: Signature
    mutated: tuple[int, ...]  # inputs written back, in output order
    forward: torch.fx.GraphModule
    partition: Partition | None = None  # training: both graphs and the saved values
    clone_saved: tuple[int, ...] = ()  # see Runtime
    number_saved: tuple[int, ...] = ()
    from_cache: bool = False


# ---- where and whether ------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$EMBER_CACHE_DIR/aotgraph``; without it, ``ember/aotgraph`` in the user's cache
    directory (``$XDG_CACHE_HOME``, else ``~/.cache``): the root ember.inductor uses too
    (:func:`ember.aotgraph.settings.cache_root`).

    >>> cache_dir().name
    'aotgraph'
    """
    return settings.cache_root() / "aotgraph"


def enabled(cache: bool = True) -> bool:
    """Whether to use the cache: ``cache`` (``aot_compile``'s argument) and the environment
    not saying ``EMBER_AOT_CACHE=0`` (the ``cache`` setting).

    >>> enabled(False)
    False
    """
    return cache and settings.section.get().cache


# ---- keys -------------------------------------------------------------------------------------


@functools.cache
def _package_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _file_hash(filename: str) -> str:
    try:
        return hashlib.sha256(Path(filename).read_bytes()).hexdigest()
    except OSError as e:
        raise Unencodable(f"the source of a function ({filename}) cannot be read") from e


def _module_of(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    if module is None:  # a method descriptor: torch.Tensor.add
        module = getattr(getattr(fn, "__objclass__", None), "__module__", None)
    return module if isinstance(module, str) else ""


def callable_id(fn: Any, *, outside: bool = False) -> JSON:
    """A name for a function that says what it computes (``Unencodable`` if there is none).

    torch's, ``operator``'s, ``math``'s and builtins are named by module and qualified
    name (fixed by the versions of torch and Python), partials with their arguments. With
    ``outside``, other Python functions are too, with a hash of the file that defines
    them and their closure cells. Python functions carry their first line (lambdas).

    >>> callable_id(torch.ops.aten.mm.default), callable_id(torch.relu)
    ('aten.mm.default', 'torch._VariableFunctionsClass.relu:0')
    >>> callable_id(lambda x: x)
    Traceback (most recent call last):
    ember.aotgraph.serialize.Unencodable: the function ...<lambda>
    """
    if outside and not isinstance(fn, torch._ops.OperatorBase | torch._ops.OpOverloadPacket):
        fn = inspect.unwrap(fn)  # functools.cache and wraps: the function itself
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(fn)
    if isinstance(fn, functools.partial):
        kw = {k: _constant_id(v) for k, v in sorted(fn.keywords.items())}
        return {"partial": [callable_id(fn.func, outside=outside), _constant_id(fn.args), kw]}
    module, name = _module_of(fn), getattr(fn, "__qualname__", None)
    owner = getattr(fn, "__self__", None)  # a bound method's object is not named: refuse
    plain_owner = owner is None or isinstance(owner, type | types.ModuleType)
    if not module or not isinstance(name, str) or not plain_owner:
        raise Unencodable(f"the function {fn!r}")
    code = getattr(fn, "__code__", None)
    line = code.co_firstlineno if isinstance(code, types.CodeType) else 0  # lambdas, by line
    ours = module.startswith("ember.aotgraph.") and _resolves(fn, module, name)
    if module.split(".")[0] in SAFE_ROOTS or ours:
        return f"{module}.{name}:{line}"  # torch's closures too: the factories are torch's
    if not outside or not isinstance(fn, types.FunctionType) or code is None:
        raise Unencodable(f"the function {module}.{name}")
    cells = [_constant_id(c.cell_contents) for c in fn.__closure__ or ()]
    return [f"{module}.{name}:{line}", _file_hash(code.co_filename), cells]


def _resolves(fn: Any, module: str, name: str) -> bool:
    """Whether ``module.name`` is ``fn`` (not a function that only claims the module)."""
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found is fn


def _constant_id(value: Any) -> JSON:
    if callable(value) and not isinstance(value, type):
        return callable_id(value, outside=True)
    if isinstance(value, tuple | list):
        return [_constant_id(v) for v in value]
    return encode_value(value)


@functools.cache
def _entry_id(op: Any, fn: Callable[..., Any]) -> str:
    return json.dumps([str(op), callable_id(fn, outside=True)])


def settings_key(
    partition: str, table: dict[Any, Callable[..., Any]] | Callable[[], Any]
) -> str | None:
    """The part of the key that comes from ``aot_compile``'s settings: the partitioner's name
    and the decomposition table, or the function that makes it (``None``: a function has
    no name, do not cache).

    >>> settings_key("min_cut", {}) == settings_key("default", {})
    False
    """
    try:
        if callable(table):
            entries = [json.dumps(callable_id(table, outside=True))]
        else:
            entries = sorted(_entry_id(op, fn) for op, fn in table.items())
    except (Unencodable, TypeError):
        return None
    return hashlib.sha256(json.dumps([partition, entries]).encode()).hexdigest()


def _tensor_id(t: torch.Tensor) -> JSON:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        raise Unencodable(f"a {type(t).__name__} input")
    flags = [t.requires_grad, t.is_conj(), t.is_neg(), t.is_inference()]
    return [list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype), str(t.device), flags]


def _inputs_id(inputs: Sequence[Any]) -> JSON:
    """Each input's metadata, and for tensors the first input sharing its storage."""
    out: list[JSON] = []
    storages: dict[int, int] = {}
    for i, value in enumerate(inputs):
        if type(value) is float:
            out.append("float")  # a symbolic input: its value is not part of the trace
            continue
        if not isinstance(value, torch.Tensor):
            raise Unencodable(f"a {type(value).__name__} input")
        first = storages.setdefault(value.untyped_storage()._cdata, i)
        out.append([_tensor_id(value), first])
    return out


def _constant_tensor_id(t: Any) -> JSON:
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        raise Unencodable(f"a get_attr {type(t).__name__}")
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return [_tensor_id(t), hashlib.sha256(data).hexdigest()]


def _module_id(lifted: Lifted) -> JSON:
    """The input graph: its code, the functions it calls, its constant tensors."""
    gm = lifted.module
    if not isinstance(gm, torch.fx.GraphModule):
        raise Unencodable(f"a {type(gm).__name__}, not a GraphModule")
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        raise Unencodable(f"a graph with {type(gm.graph._codegen).__name__}")
    targets: dict[str, JSON] = {}
    constants: dict[str, JSON] = {}
    regions: dict[str, JSON] = {}  # checkpoint tags: the partition recomputes those nodes
    names = set(lifted.names)
    for node in gm.graph.nodes:
        if "recompute" in node.meta:
            regions[node.name] = [str(node.meta["recompute"]), node.meta.get("ac_graph_id")]
        if node.op == "call_function":
            targets[node.name] = callable_id(node.target)
        elif node.op == "get_attr" and node.target not in names:
            value = serialize.fetch(gm, str(node.target))
            constants[str(node.target)] = _constant_tensor_id(value)
        elif node.op == "call_module":
            raise Unencodable(f"a call_module node ({node.target})")
    return [gm.code, targets, constants, list(lifted.names), regions]


def global_state() -> JSON:
    """The process-wide settings a traced graph's meaning depends on, as JSON: the default
    dtype (an aten factory call without ``dtype=`` makes it), autocast, and deterministic
    algorithms. Every on-disk key that names a graph holds it, so a record made under one
    default dtype never serves another.

    >>> global_state()[0]
    'torch.float32'
    """
    autocast = [
        [torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device))]
        for device in ("cpu", "cuda")
    ]
    return [str(torch.get_default_dtype()), autocast, torch.are_deterministic_algorithms_enabled()]


def record_key(
    lifted: Lifted, inputs: Sequence[Any], grad: bool, settings: str | None
) -> str | None:
    """The record's name for tracing ``lifted`` on ``inputs``; ``None``: not cacheable.
    Graphs with symbolic sizes are not: their graphs hold the ShapeEnv's symbols, which the
    key does not name, and a record keyed by the example's sizes would serve other shapes."""
    if settings is None or lifted.symbols is not None:
        return None
    try:
        parts = [
            RECORD_VERSION,
            _package_hash(),
            torch.__version__,
            list(sys.version_info[:2]),
            settings,
            _module_id(lifted),
            _inputs_id(inputs),
            [lifted.input_positions, lifted.floats],
            [_constant_id(lifted.template[i]) for i in lifted.constant_positions],
            grad,
            global_state(),
        ]
    except Unencodable:
        return None
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


# ---- records on disk --------------------------------------------------------------------------


def _path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The record for ``key``, or None (missing, unreadable, or with another key inside).

    >>> load("0" * 64) is None
    True
    """
    return read_record(_path(key), key)


def save(key: str, record: dict[str, Any]) -> None:
    """Write ``record`` for ``key`` (see :func:`write_record`).

    >>> import os
    >>> key = os.urandom(32).hex()
    >>> save(key, {"specialized": True})
    >>> load(key)
    {'specialized': True, 'key': '...'}
    """
    write_record(_path(key), key, record)


# ---- Traced <-> record ------------------------------------------------------------------------

OUTPUT_KINDS = ("graph", "input", "alias", "view", "same", "constant")


def _encode_meta(meta: TensorMeta | None) -> JSON:
    if meta is None:
        return None
    dtype, encode = encode_value(meta.dtype), serialize.encode_int
    size, stride = [encode(n) for n in meta.size], [encode(n) for n in meta.stride]
    return [size, stride, encode(meta.offset), dtype, str(meta.device)]


def _decode_meta(data: JSON, fakes: serialize.Fakes) -> TensorMeta | None:
    if data is None:
        return None
    size, stride, offset, dtype, device = data
    kind = serialize.decode_value(dtype)
    if not isinstance(kind, torch.dtype):
        raise ValueError(f"not a dtype: {dtype!r}")
    dims, steps = tuple(map(fakes.size, size)), tuple(map(fakes.size, stride))
    return TensorMeta(dims, steps, fakes.size(offset), kind, torch.device(device))


def _encode_signature(sig: Signature) -> JSON:
    outputs = [
        [
            o.kind,
            o.index,
            o.requires_grad,
            _encode_meta(o.meta),
            encode_value(o.value),
            o.creation,
            o.view,
        ]
        for o in sig.outputs
    ]
    try:
        spec = pytree.treespec_dumps(sig.out_spec)
    except (NotImplementedError, TypeError, ValueError, KeyError) as e:
        raise Unencodable(f"the output structure {sig.out_spec}") from e
    ints = [
        list(sig.graph_outputs),
        list(sig.grad_outputs),
        list(sig.grad_inputs),
        list(sig.versions),
        list(sig.out_storage),
        list(sig.replaced),
        list(sig.grad_set),
    ]
    restrided = [[i, _encode_meta(meta)] for i, meta in sig.restrided]
    return {
        "outputs": outputs,
        "out_spec": spec,
        "ints": ints,
        "training": sig.training,
        "restrided": restrided,
    }


def _decode_signature(data: JSON, fakes: serialize.Fakes | None = None) -> Signature:
    fakes = fakes or serialize.Fakes()  # SymInt sizes: the graph's own
    outputs = []
    for kind, index, grad, meta, value, creation, view in data["outputs"]:
        if kind not in OUTPUT_KINDS:
            raise ValueError(f"not an output kind: {kind!r}")
        value = serialize.decode_value(value)
        meta = _decode_meta(meta, fakes)
        outputs.append(Output(kind, int(index), bool(grad), meta, value, str(creation), bool(view)))
    spec = pytree.treespec_loads(data["out_spec"])
    graph, grad_outputs, grad_inputs, versions, shared, replaced, grad_set = map(
        _ints, data["ints"]
    )
    training = bool(data["training"])
    restrided = []
    for i, meta in data["restrided"]:
        decoded = _decode_meta(meta, fakes)
        if decoded is None:
            raise ValueError("an input's metadata after the call is missing")
        restrided.append((int(i), decoded))
    return Signature(
        tuple(outputs),
        spec,
        graph,
        grad_outputs,
        grad_inputs,
        training,
        versions,
        shared,
        tuple(restrided),
        replaced,
        grad_set,
    )


def _ints(data: JSON) -> tuple[int, ...]:
    if type(data) is not list or not all(type(v) is int for v in data):
        raise ValueError(f"not a list of ints: {data!r}")
    return tuple(data)


def encode(traced: Traced) -> dict[str, Any]:
    """A :class:`Traced` as a JSON record (``Unencodable`` if a part cannot be written)."""
    record: dict[str, Any] = {
        "signature": _encode_signature(traced.signature),
        "mutated": list(traced.mutated),
        "forward": serialize.dump(traced.forward),
    }
    part = traced.partition
    if part is not None:
        record["backward"] = serialize.dump(part.backward)
        record["partition"] = [
            list(part.saved),
            part.saved_bytes,
            part.activation_bytes,
            part.num_forward_outputs,
        ]
        record["saved"] = [list(traced.clone_saved), list(traced.number_saved)]
    return record


def decode(record: dict[str, Any], fakes: serialize.Fakes | None = None) -> Traced:
    """The :class:`Traced` a record holds, its fake values made by ``fakes`` (a graph with
    symbolic sizes: ``Fakes`` of its mode); raises :class:`Specialized` for a record that
    says tracing needed a float input's value, ``ValueError`` (or another error) for a
    record that does not decode or whose graphs do not fit its signature."""
    if record.get("specialized") is True:
        raise Specialized("tracing needed the value of a float input (recorded)")
    fakes = fakes or serialize.Fakes()
    sig = _decode_signature(record["signature"], fakes)
    forward = serialize.load(record["forward"], fakes)
    mutated = _ints(record["mutated"])
    if "partition" not in record:
        return Traced(sig, mutated, forward, from_cache=True)
    backward = serialize.load(record["backward"], fakes)
    saved, saved_bytes, activation_bytes, n_forward = record["partition"]
    names = tuple(str(s) for s in saved)
    sizes = int(saved_bytes), int(activation_bytes), int(n_forward)
    part = Partition(forward, backward, names, *sizes)
    clone, numbers = (_ints(v) for v in record["saved"])
    traced = Traced(sig, mutated, forward, part, clone, numbers, from_cache=True)
    _check_shape(traced)
    return traced


def _counts(gm: torch.fx.GraphModule) -> tuple[int, int]:
    outputs = gm.graph.output_node().args[0]
    if not isinstance(outputs, list | tuple):
        raise ValueError("a graph that does not return a list")
    return len(gm.graph.find_nodes(op="placeholder")), len(outputs)


def _check_shape(traced: Traced) -> None:
    """The graphs have the inputs and outputs the signature says (``ValueError`` if not)."""
    sig, part = traced.signature, traced.partition
    n_in, n_out = _counts(traced.forward)
    n_saved = len(part.saved) if part is not None else 0
    expected = len(sig.graph_outputs) + len(traced.mutated) + n_saved
    ok = n_out == expected and all(0 <= i < n_in for i in traced.mutated)
    if part is not None:
        bw_in, bw_out = _counts(part.backward)
        ok = ok and part.num_forward_outputs == expected - n_saved
        ok = ok and (bw_in, bw_out) == (n_saved + len(sig.grad_outputs), len(sig.grad_inputs))
        saved = range(n_saved)
        ok = ok and all(i in saved for i in (*traced.clone_saved, *traced.number_saved))
    if not ok:
        raise ValueError("a record whose graphs do not match its signature")


def cached(key: str | None, trace: Callable[[], Traced]) -> Traced:
    """``trace()``'s result: from the record for ``key`` if there is a good one, else traced
    and saved (``key`` None: traced, not saved).

    >>> import os
    >>> key, calls = os.urandom(32).hex(), []
    >>> def trace():
    ...     calls.append(1)
    ...     raise Specialized("needs the value")
    >>> for _ in range(2):
    ...     try:
    ...         cached(key, trace)
    ...     except Specialized:
    ...         pass
    >>> len(calls)  # the second time, the record said so
    1
    """
    record = load(key) if key is not None else None
    if record is not None:
        try:
            traced = decode(record)
        except Specialized:
            raise
        except Exception:  # decoding runs nothing from the file; any failure means it is
            pass  # not a record of ours after all: trace, and write it again
        else:
            if check.enabled():
                check.check_functional(traced.forward, "forward graph from the cache")
                if traced.partition is not None:
                    check.check_functional(
                        traced.partition.backward, "backward graph from the cache"
                    )
            return traced
    try:
        traced = trace()
    except Specialized:
        if key is not None:
            save(key, {"specialized": True})
        raise
    if key is not None:
        try:
            save(key, encode(traced))
        except Exception as e:  # a graph that is not cached still compiles
            if check.enabled() and not isinstance(e, Unencodable):
                raise  # in tests: a bug of the encoder, not a graph it cannot hold
    return traced
