"""The minifiers: check a backend after capture or after AOT; on failure write ``repro.py``.

``EMBER_REPRO_AFTER=capture`` checks the backend ``compile()`` was given, on the graphs
capture hands it. ``EMBER_REPRO_AFTER=aot`` checks the compilers that
:func:`ember.aotgraph.aot_compile` hands the aten forward/backward graphs (the inner
compiler, as inductor's ``compile_graph``), through the seam
:data:`ember.aotgraph.compiler_hook.COMPILER_HOOK`. ``EMBER_REPRO_LEVEL`` says what a check
does (:data:`ember.compiler.repro_settings.LEVELS`). The frame whose graph failed runs
eagerly, its reason recorded, as for any backend error; an accuracy failure raises
:class:`AccuracyError` inside the compile, so that frame runs eagerly too.

>>> import torch, ember.compiler, tempfile, pathlib
>>> def no_relu(gm, example_inputs):
...     if any(n.target is torch.relu for n in gm.graph.nodes):
...         raise RuntimeError("relu")
...     return gm.forward
>>> folder = tempfile.mkdtemp()
>>> f = ember.compiler.compile(lambda x: torch.relu(x * 2) + 1, backend=no_relu,
...                            options={"repro_after": "capture", "repro_dir": folder})
>>> f(torch.ones(2))
tensor([3., 3.])
>>> sorted(p.name for p in pathlib.Path(folder).iterdir())
['repro.py', 'repro_full.py']
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from ember.aotgraph.compiler_hook import COMPILER_HOOK
from ember.compiler import minifier, repro_script
from ember.compiler.minifier import Check, Compiler
from ember.compiler.repro_script import CompilerRef
from ember.compiler.repro_settings import ReproSettings

log = logging.getLogger("ember.compiler.repro")


class AccuracyError(RuntimeError):
    """A compiled graph's result differs from eager's beyond tolerance (repro level 4). It is
    raised inside the compile, so the frame runs eagerly with it as the recorded reason.

    >>> issubclass(AccuracyError, RuntimeError)
    True
    """


def instrument(
    backend: Compiler, ref: Callable[[], CompilerRef | None], settings: ReproSettings
) -> Compiler:
    """``backend``, checked as ``settings.after`` says (unchanged when it says nothing).
    ``ref()`` says how a script reaches ``backend`` (asked only when the check is on).

    >>> instrument(print, lambda: None, ReproSettings()) is print
    True
    """
    if settings.after == "capture":
        found = ref()
        return lambda gm, inputs: checked_call(backend, gm, inputs, found, settings, "capture")
    if settings.after == "aot":

        def hooked(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            with _aot_hook(settings):
                return backend(gm, inputs)

        return hooked
    return backend


@contextlib.contextmanager
def _aot_hook(settings: ReproSettings) -> Iterator[None]:
    def wrap(compiler: Compiler, kind: str) -> Compiler:
        ref = repro_script.reference(compiler)
        return lambda gm, inputs: checked_call(compiler, gm, inputs, ref, settings, f"aot {kind}")

    token = COMPILER_HOOK.set(wrap)
    try:
        yield
    finally:
        COMPILER_HOOK.reset(token)


def checked_call(
    compiler: Compiler,
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    ref: CompilerRef | None,
    settings: ReproSettings,
    where: str,
) -> Callable[..., Any]:
    """``compiler(gm, inputs)``; if it raises (or, at level 4, computes a wrong result), write
    the repro scripts first. The compiled graph is watched: the first time it raises when
    called, the repro is written from the inputs of that call."""
    inputs = list(inputs)
    if settings.level == 3:
        _write_full(gm, _real(inputs), ref, Check("raises", Exception), settings, where)
    try:
        compiled = compiler(gm, inputs)
        diff = _inaccuracy(compiled, gm, _real(inputs)) if settings.level == 4 else ""
    except Exception as error:
        _report(compiler, gm, inputs, Check("raises", type(error)), ref, settings, where)
        raise
    if diff:
        path = _report(compiler, gm, inputs, Check("accuracy"), ref, settings, where)
        raise AccuracyError(
            f"the compiled graph ({where}) differs from eager beyond tolerance; "
            f"repro: {path}\n{diff}"
        )

    def at_run_time(args: list[Any], error: Exception) -> None:
        check = Check("raises", type(error))
        _report(compiler, gm, args, check, ref, settings, f"{where}, at run time")

    return _Watched(compiled, at_run_time)


class _Watched:
    """A compiled graph whose first error at run time writes a repro (then propagates)."""

    __slots__ = ("compiled", "on_error", "reported")

    def __init__(
        self, compiled: Callable[..., Any], on_error: Callable[[list[Any], Exception], None]
    ) -> None:
        self.compiled, self.on_error, self.reported = compiled, on_error, False

    def __call__(self, *args: Any) -> Any:
        try:
            return self.compiled(*args)
        except Exception as error:
            if not self.reported:
                self.reported = True
                self.on_error(list(args), error)
            raise


def _real(inputs: list[Any]) -> list[Any]:
    """Real tensors for fake ones (aotgraph gives the backward compiler fakes): random
    values with the same metadata."""
    return [_materialize(t) if isinstance(t, FakeTensor) else t for t in inputs]


def _materialize(fake: torch.Tensor) -> torch.Tensor:
    real = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype)
    if fake.dtype.is_floating_point or fake.dtype.is_complex:
        real.normal_()
    else:
        real.random_(0, 2 if fake.dtype == torch.bool else 8)
    return real.requires_grad_(fake.requires_grad)


def _inaccuracy(compiled: Callable[..., Any], gm: torch.fx.GraphModule, inputs: list[Any]) -> str:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        want = gm(*minifier._clones(inputs))
        torch.manual_seed(0)
        got = compiled(*minifier._clones(inputs))
    return minifier.differs(got, want)


def _write_full(
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    ref: CompilerRef | None,
    check: Check,
    settings: ReproSettings,
    where: str,
) -> Path:
    """The whole graph as ``repro_full.py`` (``repro.py`` at level 1: nothing is minified)."""
    values = minifier.node_values(gm, inputs)
    names = {n.name for n in gm.graph.nodes if n.op in minifier.CALLS}
    whole, args = minifier.subgraph(gm, names, values)
    name = "repro.py" if settings.level == 1 else "repro_full.py"
    saved = name if check.kind == "accuracy" else ""
    text = repro_script.script(whole, args, ref, check, saved, f"after {where}, whole graph")
    return repro_script.write(Path(settings.directory), name, text, args if saved else None)


def _report(
    compiler: Compiler,
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    check: Check,
    ref: CompilerRef | None,
    settings: ReproSettings,
    where: str,
) -> Path | str:
    """Write the repro scripts for a failure; never raise (the failure itself matters more)."""
    try:
        path = _write_full(gm, _real(inputs), ref, check, settings, where)
        if settings.level >= 2:
            path = _write_minified(compiler, gm, _real(inputs), check, ref, settings, where)
    except Exception as bug:  # a bug here must not hide the backend's own error
        log.warning(
            "ember could not write a repro (after %s): %s: %s", where, type(bug).__name__, bug
        )
        return f"(none: {type(bug).__name__}: {bug})"
    log.warning(
        "ember: the backend %s (after %s); repro written to %s", check.describe(), where, path
    )
    return path


def _write_minified(
    compiler: Compiler,
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    check: Check,
    ref: CompilerRef | None,
    settings: ReproSettings,
    where: str,
) -> Path:
    """Minify the graph and write it as ``repro.py``, with random inputs where they still
    fail the same way, the saved values otherwise (always for an accuracy failure)."""
    small = minifier.minify(gm, inputs, check, compiler)
    random = [_materialize(a) if isinstance(a, torch.Tensor) else a for a in small.args]
    keep = check.kind == "accuracy" or not minifier.fails_as(check, compiler, small.gm, random)
    saved = "repro.py" if keep else ""
    before = sum(n.op in minifier.CALLS for n in gm.graph.nodes)
    after = sum(n.op in minifier.CALLS for n in small.gm.graph.nodes)
    note = f"after {where}, minified from {before} to {after} operations ({small.tests} tries)"
    if not small.fails:
        note += "\nthe graph alone did not fail again: this is the whole graph"
    text = repro_script.script(small.gm, small.args, ref, check, saved, note)
    return repro_script.write(
        Path(settings.directory), "repro.py", text, small.args if saved else None
    )
