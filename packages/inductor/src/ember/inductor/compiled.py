"""A compiled graph's callable (:class:`CompiledGraph`), and reading one back from its
graph-cache record (:func:`from_record`).

``compile_graph`` (:mod:`ember.inductor.compile`) lowers, schedules and prints a graph and
hands the result to a :class:`CompiledGraph`, which builds and loads the kernels on its first
call. A graph seen before, in any process, is read back from its record instead (the
wrapper's source, the kernels' arguments, the constants, the output structure) with the C++
library or Triton module the record names; so is each inductor graph of a portable pack
(``ember.compiler.load_artifacts``). That path imports this module only: not the lowering,
the scheduler or the printers, which a fresh compile imports where it needs them.
"""

from __future__ import annotations

import itertools
import json
import operator
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.aotgraph.compiler_hook import CALLED_BOXED
from ember.inductor import background, cache, graph_cache, settings
from ember.inductor.wrapper_bind import bind

if TYPE_CHECKING:
    from ember.inductor import wrapper_triton
    from ember.inductor.scheduler import Schedule

__all__ = ["CompiledGraph", "from_record"]


def _trace_dir() -> Path | None:
    now = settings.section.get()
    if not now.trace:
        return None
    root = Path(now.trace_dir)
    for n in itertools.count():
        path = root / f"graph{n:03d}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


class _Run:
    """One compilation: phase times and, when tracing, the files of the trace folder."""

    def __init__(self, trace: bool = True) -> None:
        self.trace = _trace_dir() if trace else None
        self.times: dict[str, float] = {}

    def phase(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        self.times[name] = time.perf_counter() - start
        if name in CHECKED:  # a compile's pass: the IR checker (sympy) is imported already
            from ember.inductor.check import check, enabled

            if enabled():
                check(out)
        self.write(f"{len(self.times):02d}_{name}.txt", out)
        return out

    def write(self, name: str, content: Any) -> None:
        if self.trace is not None:
            text = content.code if isinstance(content, torch.fx.GraphModule) else str(content)
            (self.trace / name).write_text(text)


CHECKED = {"lower", "eliminate_dead", "simplify"}


class CompiledGraph:
    """The callable ``compile_graph`` returns; it waits for the C++ build on its first call.

    ``schedule`` and ``source`` show what was generated; both are None when the graph came
    from the graph cache (see :mod:`ember.inductor.graph_cache`)."""

    def __init__(self, gm: torch.fx.GraphModule, run: _Run, spec: Any) -> None:
        self.gm, self._run, self._spec = gm, run, spec
        self._rebuild = _rebuilder(spec)
        self.schedule: Schedule | None = None
        self.source: str | None = None
        self.kernel_args: dict[str, list[str]] = {}
        self.wrapper = ""
        self.cache_hit: bool | None = None  # the kernels' library came from the disk cache
        self._build: Future[tuple[Path, str, bool]] | None = None
        self._call: Callable[..., Any] | None = None
        self._record: tuple[str, torch.fx.GraphModule] | None = None  # graph key, original gm
        self.target: wrapper_triton.Target | None = None  # the printer and device chosen
        self._kernels: dict[str, Callable[..., Any]] | None = None  # Triton launchers
        self.record: dict[str, Any] | None = None  # its graph-cache record (portable packs)
        self.in_background = False  # Triton: kernels build on a worker (ember.inductor.background)
        self._pending: Future[None] | None = None  # that build, while it runs
        self._built: Callable[..., Any] | None = None  # the wrapper it builds kernels for
        self.boxed = CALLED_BOXED.get()  # a backward graph: a wrapper with ``call_boxed``

    def __call__(self, *args: Any) -> Any:
        if self._call is None:
            self._call = self._finish()
            if self._kernels is not None:  # Triton builds each kernel on its first launch
                out = self._first_triton_call(args)
                return out if self._rebuild is None else self._rebuild(out)
        out = self._call(*args)
        return out if self._rebuild is None else self._rebuild(out)

    def direct(self) -> Callable[..., Any] | None:
        """What a call runs, giving the graph's outputs as one flat tuple, for a caller that
        wants them so (``ember.aotgraph``'s runtime: one frame less a call): the built
        wrapper of C++ kernels, where the graph's outputs are a flat tuple or list or one
        tensor. None before the first call, under Triton (whose wrapper changes while
        kernels build) or for nested outputs.

        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> from ember.inductor import compile_graph
        >>> x = torch.randn(4)
        >>> compiled = compile_graph(make_fx(lambda v: [v.sin() * 2])(x), [x])
        >>> compiled.direct() is None, type(compiled(x)), type(compiled.direct()(x))
        (True, <class 'list'>, <class 'tuple'>)
        """
        flat = self._rebuild is None or self._rebuild in (list, _ONE)
        return self._call if self._kernels is None and flat else None

    def call_boxed(self, args: list[Any]) -> Any:
        """Call with the inputs in ``args``, a list this empties: the wrapper drops each
        input after its last use, so a value the caller no longer holds is freed then
        (:data:`ember.aotgraph.compiler_hook.CALLED_BOXED`). Otherwise as ``self(*args)``.

        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> from ember.inductor import compile_graph
        >>> x = torch.randn(4)
        >>> compiled = compile_graph(make_fx(lambda v: v.sin() * 2)(x), [x])
        >>> args = [x]
        >>> torch.testing.assert_close(compiled.call_boxed(args), x.sin() * 2)
        """
        boxed = getattr(self._call, "boxed", None)
        if boxed is None:
            return self(*args)
        out = boxed(args)
        return out if self._rebuild is None else self._rebuild(out)

    def _first_triton_call(self, args: tuple[Any, ...]) -> Any:
        """The first call of Triton kernels, which builds them: on a worker while this call
        and the next run as aten calls (:mod:`ember.inductor.background`), or here. A kernel
        Triton fails to build (its errors come from the ``triton`` package) runs the graph
        as aten calls from then on (tests: it raises)."""
        assert self._call is not None
        if self.in_background and self.target is not None and not background.capturing():
            self._pending = background.start(self._call, args, self.target.device)
            self._built, self._call = self._call, self._while_building
            return self._eager(*args)
        try:
            return self._call(*args)
        except Exception as e:
            self._give_up(e)
            return self._call(*args)

    def _give_up(self, e: Exception) -> None:
        """After a failed build: aten calls from now on if Triton failed, else raise (a bug
        of ours; and in tests, always)."""
        from ember.inductor.check import enabled

        if not type(e).__module__.startswith("triton") or enabled():
            raise e
        warnings.warn(
            f"ember.inductor: a Triton kernel failed to build, running eagerly: {e!r}",
            stacklevel=4,
        )
        self._call = self._eager

    def _eager(self, *args: Any) -> tuple[Any, ...]:
        """The graph as aten calls, its outputs flat as the wrapper's."""
        return tuple(pytree.tree_leaves(self.gm(*args)))

    def _while_building(self, *args: Any) -> Any:
        """A call while the kernels build on a worker: aten calls, unless the build is done
        or a CUDA graph is being recorded (then it waits: a recording holds the kernels)."""
        pending = self._pending
        if pending is not None and not pending.done() and not background.capturing():
            return self._eager(*args)
        self.wait_compiled()  # (None: another thread has handed over already)
        call = self._call
        assert call is not None
        return call(*args)

    def wait_compiled(self) -> None:
        """Wait for kernels building in the background; from then on calls launch them (or,
        if the build failed, run as aten calls). ``ember.aotgraph.cudagraphs`` calls it
        before it records a graph."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        assert self._built is not None
        self._call = self._built  # the wrapper, its kernels built
        try:
            pending.result()
        except Exception as e:
            self._give_up(e)

    def _finish(self) -> Callable[..., Any]:
        from ember.inductor.wrapper import wrapper_source  # a fresh compile's (the printers')

        start = time.perf_counter()
        lib, so_key = None, None
        if self._build is not None:
            try:
                path, command, self.cache_hit = self._build.result()
            except cache.CompileError as e:
                warnings.warn(
                    f"ember.inductor: C++ build failed, running eagerly: {e}", stacklevel=3
                )
                return self._eager  # (outputs flat, as the wrapper's: gm.forward's nest)
            self._run.write(
                "compile_command.txt", f"{command}\n# cache hit: {self.cache_hit}\n# {path}\n"
            )
            lib, so_key = cache.load(path), path.parent.name
        assert self.schedule is not None
        if self._kernels is None:  # C++ kernels take data pointers
            self.wrapper, consts = wrapper_source(self.schedule, self.kernel_args, boxed=self.boxed)
        else:  # Triton launchers take the tensors
            self.wrapper, consts = wrapper_source(self.schedule, self.kernel_args, tensors=True)
        device = None if self.target is None else self.target.device
        call = bind(self.wrapper, consts, self.kernel_args, lib, self._kernels, device)
        self._run.times["build_and_load"] = time.perf_counter() - start
        self._run.write("06_wrapper.py", self.wrapper)
        self._run.write("times.json", json.dumps(self._run.times, indent=1))
        if self._record is not None:
            self._save(so_key, consts)
        return call

    def _save(self, so_key: str | None, consts: dict[str, Any]) -> None:
        from ember.inductor import triton_cache  # (its Triton printer: a fresh compile's)

        assert self._record is not None
        key, original = self._record
        paths = graph_cache.tensor_paths(original)
        try:
            record = {
                "wrapper": self.wrapper,
                "kernel_args": self.kernel_args,
                "so": so_key,
                "module": triton_cache.module_of(self),  # the Triton module (else None)
                "consts": {n: graph_cache.encode(v, paths) for n, v in consts.items()},
                "spec": None if self._spec is None else pytree.treespec_dumps(self._spec),
            }
        except (graph_cache.Unencodable, TypeError, NotImplementedError):
            return
        self.record = record
        graph_cache.save(key, record)


def from_record(
    gm: torch.fx.GraphModule,
    record: dict[str, Any],
    run: _Run,
    target: wrapper_triton.Target | None = None,
) -> CompiledGraph | None:
    """A ready :class:`CompiledGraph` from a graph-cache record, or None if its parts are
    gone: the C++ library the record names (``so``, checked against its checksum), or its
    Triton module (``module``, on ``target``'s device). A Triton graph's first call goes
    through :meth:`CompiledGraph._first_triton_call` (a kernel Triton fails to build then
    runs the graph as aten calls), as a fresh compile's does.

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from ember.inductor import compile_graph
    >>> x = torch.randn(4, 4)
    >>> fresh = compile_graph(make_fx(lambda x: (x.sin() + 1,))(x), [x])
    >>> again = from_record(fresh.gm, fresh(x) and fresh.record, _Run(trace=False))
    >>> again.cache_hit, torch.equal(again(x)[0], fresh(x)[0])
    (True, True)
    """
    lib, kernels = None, None
    if record.get("module") is not None:  # Triton's
        from ember.inductor.wrapper_triton import load_module

        assert target is not None, "a Triton record is read back for a target device"
        kernels = load_module(record["module"], list(record["kernel_args"]))
        if kernels is None:
            return None
    elif (so_key := record["so"]) is not None:  # C++'s (None: a graph of extern calls only)
        entry = cache.cache_dir() / so_key[:2] / so_key
        if not cache.valid(entry, so_key):
            return None
        lib = cache.load(entry / "kernels.so")
    try:
        consts = {n: graph_cache.decode(v, gm) for n, v in record["consts"].items()}
    except (graph_cache.Unencodable, AttributeError):
        return None
    spec = None if record["spec"] is None else pytree.treespec_loads(record["spec"])
    compiled = CompiledGraph(gm, run, spec)
    compiled.kernel_args, compiled.wrapper = record["kernel_args"], record["wrapper"]
    compiled.cache_hit, compiled.record = True, record
    device = None if target is None else target.device
    call = bind(record["wrapper"], consts, record["kernel_args"], lib, kernels, device)
    if kernels is not None:
        compiled.target, compiled._kernels = target, kernels
        call = _first_call(compiled, call)
    compiled._call = call
    run.write("06_wrapper.py", compiled.wrapper + "\n# from the graph cache\n")
    return compiled


def _first_call(compiled: CompiledGraph, call: Callable[..., Any]) -> Callable[..., Any]:
    def first(*args: Any) -> Any:
        compiled._call = call  # from now on, the wrapper itself
        return compiled._first_triton_call(args)

    return first


_ONE = operator.itemgetter(0)


def _rebuilder(spec: Any) -> Callable[[Any], Any] | None:
    """How to turn the wrapper's flat tuple into the graph's output (None: it already is)."""
    if spec is None:
        return None
    if spec.is_leaf():  # the graph returns one tensor, not a container
        return _ONE
    flat = all(child.num_leaves == 1 and child.is_leaf() for child in spec.children())
    if flat and spec.type is tuple:
        return None
    if flat and issubclass(spec.type, list):  # fx's immutable_list too: callers get a list
        return list
    return lambda out: _plain(pytree.tree_unflatten(list(out), spec))


def _plain(tree: Any) -> Any:
    """fx's immutable containers (from the output node's arguments) as list and dict."""
    if isinstance(tree, list):
        return [_plain(t) for t in tree]
    if isinstance(tree, tuple) and type(tree) is tuple:
        return tuple(_plain(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    return tree
