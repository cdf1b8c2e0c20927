"""Portable compiled artifacts: a new process starts from a pack, with no capture at all.

:func:`save_artifacts` writes one file holding what this process compiled: per user code
object (named by qualified name, first line and a hash of its bytecode, never by ``id``),
each cache entry's guards (objects named by import path, or re-resolved from the new
frame by their source, ``self.layers[0]``), its replacement bytecode (``marshal``) and
constants, and its captured graph; plus the disk-cache records the backends read or
wrote (ember.aotgraph's traced graphs, ember.inductor's graph records and kernel
libraries). :func:`load_artifacts` puts the records back into the disk caches and hands
the entries to the frame hook: the first call of a packed frame installs its entry without
translating, and its graph goes to the backend on its first call, where the aotgraph and
inductor caches hit (no trace, no lowering, no C++ build).

**Loading a pack runs code** (bytecode, shared libraries): trust a pack as you would a
pickle. With ``EMBER_ARTIFACTS_KEY`` (``config.debug.artifacts_key``) set, packs are
signed with HMAC-SHA256 and only packs signed with that key load. A pack made by other
ember, torch or Python versions, or on another CPU, or whose bytes changed, is ignored
with an :class:`ArtifactsWarning` and the reason; its frames compile as usual.

>>> import torch, tempfile, os, ember.compiler
>>> f = ember.compiler.compile(lambda x: x.cos() + 1, backend="eager")
>>> _ = f(torch.ones(2))
>>> path = os.path.join(tempfile.mkdtemp(), "pack.ember")
>>> saved = save_artifacts(path)
>>> saved.entries >= 1, load_artifacts(path).loaded
(True, True)
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import hmac
import importlib
import json
import logging
import marshal
import os
import platform
import sys
import tempfile
import types
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ember.aotgraph.settings import cache_root
from ember.capture import _eval_frame, hook, prebuilt
from ember.capture.frame_compiler import GRAPH_ATTRIBUTE, _caches, _native_function
from ember.capture.hook import Frame
from ember.compiler.artifacts_aot import PackedAOT, pack_compiled
from ember.compiler.artifacts_codec import (
    Unpackable,
    decode,
    decode_graph,
    decode_guard,
    encode,
    encode_graph,
    encode_guard,
)
from ember.compiler.configuration import config
from ember.guards import CompiledGuards, FrameSpec, GuardKind, GuardSet, Source, WeakIdentity
from ember.guards.codegen import CheckEmitter, compiled_source, precompiled
from ember.inductor import cache as inductor_cache

__all__ = ["ArtifactsWarning", "LoadReport", "SaveReport", "load_artifacts", "save_artifacts"]

log = logging.getLogger("ember.compiler.artifacts")

MAGIC = b"EMBERPACK 3\n"
FORMAT = 3


class ArtifactsWarning(UserWarning):
    """A pack that was not loaded (versions, CPU, corruption, signature), with the reason."""


@dataclass(frozen=True, slots=True)
class SaveReport:
    """What :func:`save_artifacts` wrote: entries packed, disk-cache files packed, and the
    entries left out (``"code: reason"``; those frames compile in the new process)."""

    path: str
    entries: int
    files: int
    left_out: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What :func:`load_artifacts` did: ``loaded`` False with the ``reason`` when the pack
    was refused; else the entries handed to the frame hook and the cache files installed."""

    loaded: bool
    reason: str = ""
    entries: int = 0
    files: int = 0


# ---- the pack's key: what must match for its contents to be valid here --------------------


def _source_hash() -> str:
    """The source of the layers whose output a pack replays as it is (capture's bytecode,
    guards' checks); aotgraph's and inductor's records carry keys of their own."""
    import ember.capture
    import ember.guards

    digest = hashlib.sha256()
    for package in (ember.capture, ember.guards):
        for path in sorted(Path(next(iter(package.__path__))).glob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def pack_key() -> dict[str, str]:
    """The versions a pack is valid for (compared whole at load)."""
    names = ("guards", "capture", "aotgraph", "inductor", "compiler")  # (compiler: maybe
    # still importing, when EMBER_ARTIFACTS loads a pack at its import)
    versions = [importlib.import_module(f"ember.{n}").__version__ for n in names]
    return {
        "format": str(FORMAT),
        "ember": " ".join(versions) + " " + _source_hash(),
        "torch": torch.__version__,
        "python": f"{sys.implementation.name} {platform.python_version()}",
        "machine": platform.machine(),
        "cpu": inductor_cache._cpu_id(),
    }


def _signature(key: bytes, header_key: dict[str, str], body: bytes) -> str:
    text = json.dumps(header_key, sort_keys=True).encode()
    return hmac.new(key, text + b"\n" + body, hashlib.sha256).hexdigest()


def _secret() -> bytes | None:
    key = config.debug.artifacts_key
    return key.encode() if key else None


# ---- saving -----------------------------------------------------------------------------------


def _entry(code: types.CodeType, fn: Any, checked: CompiledGuards) -> dict[str, Any]:
    """One cache entry as JSON, or :class:`Unpackable`."""
    guards = [encode_guard(g) for g in checked.guards.guards]
    if not isinstance(fn, types.FunctionType):
        raise Unpackable(f"an entry running a {type(fn).__name__}")
    try:
        codes = _guard_codes(guards, checked)
    except Exception as e:  # only a speed-up: the loading process compiles them instead
        log.info("guard code of an entry not packed: %s: %s", type(e).__name__, e)
        codes = {}
    head = {"guards": guards, "codes": codes}
    if GRAPH_ATTRIBUTE in fn.__dict__:
        return {"kind": "graph", **head, **_pack_replacement(fn)}
    if fn.__code__.co_code == code.co_code:
        return {"kind": "native", **head}  # no tensor work: runs as it is
    return {"kind": "break", **head, **_pack_break(fn)}


def _guard_codes(guards: list[dict[str, Any]], checked: CompiledGuards) -> dict[str, str]:
    """The compiled code of the functions a loading process generates for this entry: the
    check of the guards it decodes (pins included) and the fetch of its re-resolved objects,
    by the digest of their source (``ember.guards.codegen.precompiled``). Made here from the
    same guards, read back with this process's objects, so the source is the same text."""
    objects = {
        g.source: g.expected.get() if isinstance(g.expected, WeakIdentity) else g.expected
        for g in checked.guards.guards
        if g.kind is GuardKind.ID_MATCH
    }
    frame = checked.frame
    guards = json.loads(json.dumps(guards))  # as the loader reads them: each value a new object
    rebuilt = GuardSet(g for d in guards for g in decode_guard(d, objects.__getitem__))
    texts = [rebuilt.compile(frame).source]  # as the loader compiles it (stamps and all)
    fetch = _fetch_source(guards, frame)
    if fetch is not None:
        texts.append(fetch[2])
    codes = {}
    for text in texts:
        digest, code = compiled_source(text, frame)
        codes[digest] = _b64(marshal.dumps(code))
    return codes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _pack_replacement(fn: types.FunctionType) -> dict[str, Any]:
    """A function ``codegen.generate`` made: its bytecode, constants and graph."""
    graph = fn.__dict__.get(GRAPH_ATTRIBUTE, False)
    if graph is False or fn.__defaults__ is None or len(fn.__defaults__) != 5:
        raise Unpackable("a function that is not a graph's replacement")
    compiled, unhooked, _, constants, builtins_ = fn.__defaults__
    if unhooked is not _eval_frame.call_unhooked or builtins_ is not builtins:
        raise Unpackable("a replacement function of another shape")
    code = _b64(marshal.dumps(fn.__code__))
    return {"code": code, "constants": encode(constants), **_compiled(compiled, graph)}


def _pack_break(fn: types.FunctionType) -> dict[str, Any]:
    """The code around a graph break: its bytecode with the functions it calls (the compiled
    prefix, the resume functions) written apart, by what makes them."""
    consts, functions = list(fn.__code__.co_consts), []
    for index, const in enumerate(consts):
        if not isinstance(const, types.FunctionType):
            continue
        if GRAPH_ATTRIBUTE in const.__dict__:  # the graph before the break
            functions.append([index, {"prefix": _pack_replacement(const)}])
        else:  # a resume function: the original's globals and closure around its own code
            functions.append([index, {"resume": _b64(marshal.dumps(const.__code__))}])
        consts[index] = None
    try:
        code = _b64(marshal.dumps(fn.__code__.replace(co_consts=tuple(consts))))
    except ValueError as e:  # a constant marshal cannot write
        raise Unpackable(f"the code around a graph break: {e}") from None
    return {"code": code, "functions": functions}


def _compiled(compiled: Any, graph: torch.fx.GraphModule | None) -> dict[str, Any]:
    """The captured graph and, where it packs, what the backend made of it (a pack's own
    entries not run yet in this process are packed as they came)."""
    if isinstance(compiled, _Deferred):
        return {"graph": compiled.graph, "aot": None}
    inner = getattr(compiled, "compiled", compiled)  # under the output-count check
    owner = inner if inner is graph else getattr(inner, "__self__", None)
    if isinstance(owner, torch.fx.GraphModule) and owner is graph:  # "eager": gm.forward
        return {"graph": encode_graph(owner), "aot": None, "runs_graph": True}
    if isinstance(compiled, PackedAOT):
        if compiled.delegate is None:
            return {"graph": compiled.graph, "aot": compiled.data}
        packed = compiled.graph
        compiled = compiled.delegate
    else:
        assert graph is not None
        packed = encode_graph(graph)
    _finish_kernels(compiled, set())
    try:
        aot = pack_compiled(compiled)
    except Unpackable as why:  # the graph still goes to the backend: its caches are packed
        log.info("backend result not packed (the new process calls the backend): %s", why)
        aot = None
    return {"graph": packed, "aot": aot}


def _frames() -> tuple[list[dict[str, Any]], list[str]]:
    frames, left_out = [], []
    for code, cache in list(_caches.items()):
        entries = []
        for cache_entry in cache.entries:
            try:
                entries.append(_entry(code, cache_entry.translation, cache_entry.guards))
            except Unpackable as why:
                left_out.append(f"{cache.name}: {why}")
        if entries:
            frames.append({"code": prebuilt.code_key(code), "name": cache.name,
                           "entries": entries})  # fmt: skip
    return frames, left_out


# where a backend's result keeps the callables it made (AOTCompiled, Runtime, wrappers)
# attributes that lead from a backend's result to its compiled graphs ("fn": the report's
# call counter, reporting._Counted)
_INNER = ("compiled", "training", "inference", "fallback", "forward", "backward", "func", "fn")


def _finish_kernels(obj: Any, seen: set[int], depth: int = 0) -> None:
    """Build and load the C++ kernels of every inductor graph inside ``obj`` not called yet
    (a backward graph before any backward pass): its graph record is written then, so the
    pack holds it and the new process does not lower it again."""
    from ember.inductor.compiled import CompiledGraph

    if obj is None or depth > 8 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, CompiledGraph):
        if obj._call is None and obj._kernels is None:  # C++ kernels (Triton's build lazily)
            obj._call = obj._finish()
        return
    for name in _INNER:
        _finish_kernels(getattr(obj, name, None), seen, depth + 1)
    for inner in (getattr(obj, "variants", None) or {}).values():
        _finish_kernels(inner, seen, depth + 1)


def _cache_files() -> Iterator[tuple[str, bytes]]:
    """The disk-cache files this process read or wrote, relative to the cache root."""
    from ember.aotgraph import store  # not imported: this process touched none of its files

    root = cache_root().resolve()
    libraries = [p for so in list(inductor_cache._LOADED) for p in (so, so.parent / "ok")]
    for path in [*store.TOUCHED, *libraries]:
        try:
            rel = Path(path).resolve().relative_to(root)
            yield rel.as_posix(), Path(path).read_bytes()
        except (ValueError, OSError):
            continue  # another cache root, or gone since


def save_artifacts(path: str | os.PathLike[str]) -> SaveReport:
    """Write what this process compiled into one file at ``path`` (see the module doc)."""
    frames, left_out = _frames()  # first: it builds the kernels not built yet
    blobs: list[bytes] = []
    offset = 0

    def put(data: bytes) -> dict[str, int]:
        """Compress ``data`` on its own; where it lies after the index."""
        nonlocal offset
        blob = zlib.compress(data, 1)
        blobs.append(blob)
        offset += len(blob)
        return {"at": offset - len(blob), "length": len(blob)}

    # each frame's entries apart: a process reads (decompresses, parses) only those of the
    # frames it runs, not the whole program's (a pack of the zoo: 8 models)
    index = []
    for frame in frames:
        entries = json.dumps(frame["entries"]).encode()
        index.append({"code": frame["code"], "name": frame["name"],
                      "entries": len(frame["entries"]), **put(entries)})  # fmt: skip
    files = []
    for rel, data in _cache_files():  # each compressed alone: one already there is not read
        digest = hashlib.sha256(data).hexdigest()
        files.append({"path": rel, "size": len(data), "sha256": digest, **put(data)})
    meta = zlib.compress(json.dumps({"frames": index, "files": files}).encode(), 1)
    body = len(meta).to_bytes(8, "little") + meta + b"".join(blobs)
    key = pack_key()
    secret = _secret()
    header = {
        "key": key,
        "sha256": hashlib.sha256(body).hexdigest(),
        "hmac": None if secret is None else _signature(secret, key, body),
        "left_out": left_out,
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-pack-")
    with os.fdopen(fd, "wb") as f:
        f.write(MAGIC + json.dumps(header).encode() + b"\n" + body)
    os.replace(tmp, target)
    count = sum(frame["entries"] for frame in index)
    return SaveReport(str(target), count, len(files), tuple(left_out))


# ---- loading ----------------------------------------------------------------------------------


class _Refused(Exception):
    pass


def _read(path: Path) -> tuple[dict[str, Any], bytes]:
    """The pack's header and body, once its key, checksum and signature hold."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _Refused(f"cannot read it: {e}") from None
    if not data.startswith(MAGIC):
        raise _Refused("not an ember pack (or another format version)")
    head, _, body = data[len(MAGIC) :].partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        raise _Refused("its header is corrupt") from None
    here = pack_key()
    if header.get("key") != here:
        theirs = header.get("key") or {}
        diff = [f"{k} {theirs.get(k)!r} != {here[k]!r}" for k in here if theirs.get(k) != here[k]]
        raise _Refused(f"made for other versions: {'; '.join(diff)}")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise _Refused("its contents are corrupt (checksum mismatch)")
    secret = _secret()
    if secret is not None:
        if not header.get("hmac"):
            raise _Refused("it is not signed, and EMBER_ARTIFACTS_KEY is set")
        if not hmac.compare_digest(str(header["hmac"]), _signature(secret, here, body)):
            raise _Refused("its signature does not match EMBER_ARTIFACTS_KEY")
    return header, body


def _same_file(target: Path, item: dict[str, Any]) -> bool:
    try:
        if target.stat().st_size != item["size"]:
            return False
        return bool(hashlib.sha256(target.read_bytes()).hexdigest() == item["sha256"])
    except OSError:
        return False


def _install(files: list[dict[str, Any]], blobs: bytes) -> int:
    """Write the pack's cache files under this process's cache root (unless there already)."""
    root = cache_root()
    written = 0
    for item in files:
        rel = Path(item["path"])
        if rel.is_absolute() or ".." in rel.parts:
            raise _Refused(f"a file outside the cache: {rel}")
        target = root / rel
        if _same_file(target, item):
            continue
        data = zlib.decompress(blobs[item["at"] : item["at"] + item["length"]])
        if hashlib.sha256(data).hexdigest() != item["sha256"]:
            raise _Refused(f"its file {rel} is corrupt")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-pack-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        written += 1
    return written


def load_artifacts(path: str | os.PathLike[str]) -> LoadReport:
    """Load the pack at ``path``: its cache files go to ember's disk caches, its entries to
    the frame hook. A refused pack (versions, CPU, corruption, signature) loads nothing; it
    warns (:class:`ArtifactsWarning`) and says why in the report."""
    try:
        _, body = _read(Path(path))
        size = int.from_bytes(body[:8], "little")
        data = json.loads(zlib.decompress(body[8 : 8 + size]))
        blobs = body[8 + size :]
        files = _install(data["files"], blobs)
        frames = []
        for f in data["frames"]:
            blob = blobs[f["at"] : f["at"] + f["length"]]
            frames.append((f["code"], int(f["entries"]), _PackedFrame(f["name"], blob)))
    except (_Refused, ValueError, KeyError, TypeError, zlib.error, OSError) as e:
        reason = f"ember pack {os.fspath(path)!r} ignored: {e}"
        warnings.warn(reason, ArtifactsWarning, stacklevel=2)
        return LoadReport(False, reason)
    for code, count, packed in frames:
        for index in range(count):
            prebuilt.register(code, _Builder(packed, index))
    return LoadReport(True, "", sum(count for _, count, _ in frames), files)


class _PackedFrame:
    """A code object's packed entries, decompressed and parsed when a frame of that code
    first asks for them (the pack's checksum already covered their bytes)."""

    __slots__ = ("_blob", "_entries", "name")

    def __init__(self, name: str, blob: bytes) -> None:
        self.name, self._blob = name, blob
        self._entries: list[dict[str, Any]] | None = None

    def entry(self, index: int) -> dict[str, Any]:
        if self._entries is None:
            self._entries = json.loads(zlib.decompress(self._blob))
            self._blob = b""
        return self._entries[index]


@dataclass(frozen=True, slots=True)
class _Builder:
    """One packed entry, built for a frame of its code (see ``ember.capture.prebuilt``)."""

    frame: _PackedFrame
    index: int

    def __call__(
        self, frame: Frame, build: Callable[..., Any]
    ) -> tuple[CompiledGuards, Any] | None:
        name = self.frame.name
        spec = FrameSpec.from_function(frame.function)
        args = frame.args
        try:
            entry = self.frame.entry(self.index)
            codes = {k: marshal.loads(base64.b64decode(v)) for k, v in entry["codes"].items()}
            with precompiled(codes):  # the check and fetch the saving process compiled
                fetch = _fetch_reresolved(entry["guards"], spec, args)
                guards = GuardSet(g for d in entry["guards"] for g in decode_guard(d, fetch))
                checked = guards.compile(spec)
        except Exception as e:  # an object the pack names is not there: not this entry
            log.info("packed entry of %s not used: %s: %s", name, type(e).__name__, e)
            return None
        if not checked.check(*args):
            return None
        try:
            return checked, _FUNCTIONS[entry["kind"]](entry, frame, build)
        except Exception as e:  # bytecode for other free variables, a corrupt entry
            log.info("packed entry of %s not used: %s: %s", name, type(e).__name__, e)
            return None


def _fetch_source(
    guards: list[dict[str, Any]], spec: FrameSpec
) -> tuple[list[Source], CheckEmitter, str] | None:
    """The sources of the identity guards the pack re-resolves, and the emitter and source
    of the one function that fetches them all; None if there are none."""
    wanted = [d["source"] for d in guards if isinstance(d["expected"], dict)
              and "reresolve" in d["expected"]]  # fmt: skip
    sources = list(dict.fromkeys(decode(source) for source in wanted))
    if not sources:
        return None
    em = CheckEmitter(spec)
    names = [em.value(source) for source in sources]
    return sources, em, em.render("fetch_packed", [*em.lines, f"return ({', '.join(names)},)"])


def _fetch_reresolved(
    guards: list[dict[str, Any]], spec: FrameSpec, args: tuple[Any, ...]
) -> Callable[[Source], Any]:
    """The frame's objects at the sources of the identity guards the pack re-resolves
    (``self.layers[0]``), fetched by one generated function (a model has dozens: one compile,
    not one each); raises, as that function does, if one is not there."""
    found = _fetch_source(guards, spec)
    if found is None:
        nothing: dict[Source, Any] = {}
        return nothing.__getitem__
    sources, em, text = found
    return dict(zip(sources, em.make(text)(*args), strict=True)).__getitem__


def _code(text: str, frame: Frame) -> types.CodeType:
    """Packed bytecode, with this frame's file name (tracebacks point at the user's file)."""
    code = marshal.loads(base64.b64decode(text))
    if not isinstance(code, types.CodeType):
        raise ValueError("not bytecode")
    return code.replace(co_filename=frame.code.co_filename)


def _break_function(entry: dict[str, Any], frame: Frame, build: Callable[..., Any]) -> Any:
    """The code around a graph break, with its prefix and resume functions made again."""
    code = _code(entry["code"], frame)
    consts = list(code.co_consts)
    for index, item in entry["functions"]:
        if "prefix" in item:
            made = _replacement(item["prefix"], frame, build)
            hook.own(made.__code__)  # the prefix is ember's: never intercepted
        else:
            made = hook.function_like(_code(item["resume"], frame), frame.function)
        consts[index] = made
    code = code.replace(co_consts=tuple(consts))
    function = frame.function
    return types.FunctionType(code, function.__globals__, code.co_name, None, function.__closure__)


# entry kind -> how its function is made for a frame
_FUNCTIONS: dict[str, Callable[[dict[str, Any], Frame, Callable[..., Any]], Any]] = {
    "native": lambda entry, frame, build: _native_function(frame.code, frame.function),
    "graph": lambda entry, frame, build: _replacement(entry, frame, build),
    "break": _break_function,
}


def _replacement(entry: dict[str, Any], frame: Frame, build: Callable[..., Any]) -> Any:
    """The packed replacement function, bound to this frame's globals and closure."""
    code = _code(entry["code"], frame)
    if code.co_freevars != frame.code.co_freevars:
        raise _Refused(f"free variables {code.co_freevars} != {frame.code.co_freevars}")
    function = frame.function
    aot = entry.get("aot")
    deferred = _Deferred(entry["graph"], build)
    compiled: Any = deferred if aot is None else PackedAOT(aot, entry["graph"], build)
    if entry.get("runs_graph"):  # the backend ran the captured graph as it is ("eager")
        graph = decode_graph(entry["graph"])
        compiled = graph.forward
    defaults = (compiled, _eval_frame.call_unhooked, function.__globals__,
                decode(entry["constants"]), builtins)  # fmt: skip
    fn = types.FunctionType(code, function.__globals__, code.co_name, defaults,
                            function.__closure__)  # fmt: skip
    deferred.fn = fn
    # packed again from ``compiled`` (see _compiled)
    fn.__dict__[GRAPH_ATTRIBUTE] = graph if entry.get("runs_graph") else None
    return fn


class _Deferred:
    """A packed graph's compiled callable: on its first call the graph is read back and
    given to the backend (whose disk caches the pack filled), and the result replaces this
    object in the replacement function's defaults."""

    __slots__ = ("build", "fn", "graph")

    def __init__(self, graph: Any, build: Callable[..., Any]) -> None:
        self.graph, self.build = graph, build
        self.fn: types.FunctionType | None = None

    def __call__(self, *inputs: Any) -> Any:
        gm = decode_graph(self.graph)
        compiled = self.build(gm, list(inputs))
        fn = self.fn
        assert fn is not None and fn.__defaults__ is not None
        fn.__defaults__ = (compiled, *fn.__defaults__[1:])
        fn.__dict__[GRAPH_ATTRIBUTE] = gm  # packed again by this process's save_artifacts
        return compiled(*inputs)


def load_from_environment() -> LoadReport | None:
    """Load the pack ``EMBER_ARTIFACTS`` names, if it names one (at import)."""
    path = config.debug.artifacts
    return load_artifacts(path) if path else None
