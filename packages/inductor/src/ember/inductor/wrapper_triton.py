"""Which printer a graph gets, and how a Triton module is cached and loaded.

:func:`choose` picks the printer from the inputs' device: CUDA tensors get Triton, CPU
tensors C++ unless the ``cpu_backend`` setting (or option) asks for Triton, which then runs
under Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run it). Inputs on several
devices, or on a device without a printer, run as aten calls. triton is imported only
when a graph needs it: ember.inductor works without it.

>>> choose([torch.ones(2)], "cpp")
Target(printer='cpp', device='cpu', reason='CPU inputs')
>>> choose([torch.ones(2)], "fortran")
Traceback (most recent call last):
...
ValueError: cpu_backend='fortran': choose one of ('cpp', 'triton')
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ember.inductor import cache
from ember.inductor.codegen_triton import module_source
from ember.inductor.knobs import Knobs
from ember.inductor.scheduler import Kernel, Schedule

__all__ = ["CPU_BACKENDS", "Target", "choose", "codegen", "load", "load_module", "module_key"]

CPU_BACKENDS = ("cpp", "triton")  # the printers CPU tensors may get


@dataclass(frozen=True, slots=True)
class Target:
    """The printer a graph gets (``cpp``, ``triton``, or ``eager``: aten calls), the device
    its buffers live on, and why (recorded in the trace folder and the log)."""

    printer: str
    device: str
    reason: str


def choose(example_inputs: Sequence[Any], cpu_backend: str) -> Target:
    """The printer for a graph with these inputs; a bad ``cpu_backend`` is an error."""
    if cpu_backend not in CPU_BACKENDS:
        raise ValueError(f"cpu_backend={cpu_backend!r}: choose one of {CPU_BACKENDS}")
    devices = sorted({str(t.device) for t in example_inputs if isinstance(t, torch.Tensor)})
    if len(devices) > 1:
        return Target("eager", devices[0], f"inputs on several devices: {', '.join(devices)}")
    device = devices[0] if devices else "cpu"
    kind = torch.device(device).type
    if kind == "cpu":
        if cpu_backend == "cpp":
            return Target("cpp", device, "CPU inputs")
        _require_interpreter()
        return Target("triton", device, "cpu_backend='triton': Triton's interpreter")
    if kind == "cuda":
        if _triton() is None:
            return Target("eager", device, "CUDA inputs, and triton is not importable")
        return Target("triton", device, "CUDA inputs")
    return Target("eager", device, f"no printer for {kind} tensors")


def _triton() -> ModuleType | None:
    try:  # optional (the 'triton' extra), and imported only when a graph needs it
        return importlib.import_module("triton")
    except ImportError:
        return None


def _require_interpreter() -> None:
    """Triton runs CPU tensors only under its interpreter, which must be on before triton
    is imported (its standard library is compiled for one mode at import)."""
    triton = _triton()
    if triton is None:
        raise RuntimeError(
            "cpu_backend='triton' needs triton: pip install 'ember-inductor[triton]'"
        )
    if not _interpreting(triton):
        raise RuntimeError(
            "cpu_backend='triton' runs CPU tensors under Triton's interpreter: set"
            " TRITON_INTERPRET=1 before triton is first imported"
        )


def _interpreting(triton: ModuleType) -> bool:
    """Kernels decorated now run under the interpreter, and so does Triton's standard
    library (``tl.sum``, ...), which was decorated when triton was imported."""
    standard = type(triton.language.sum).__name__ == "InterpretedFunction"
    return bool(triton.knobs.runtime.interpret) and standard


def codegen(
    sched: Schedule, target: Target, per_kernel: Mapping[str, Knobs] | None = None
) -> tuple[str, dict[str, list[str]]]:
    """The Triton module of ``sched`` for ``target`` and each kernel's arguments (``per_kernel``:
    kernels under knobs of their own); raises
    :class:`~ember.inductor.codegen_triton.Unsupported` for what the printer cannot write."""
    triton = _triton()
    interpret = triton is not None and _interpreting(triton)
    return module_source(
        sched, interpret=interpret or target.device == "cpu", per_kernel=per_kernel
    )


def load(source: str, sched: Schedule) -> dict[str, Callable[..., Any]]:
    """Each kernel's launcher from the module ``source``, written once under the cache
    directory (``<cache>/triton/<key[:2]>/<key>.py``, keyed by content and triton's
    version) and imported; Triton compiles (or its own cache loads) each kernel on its
    first launch."""
    key = module_key(source)
    path = _module_path(key)
    if not path.is_file() or path.read_text() != source:
        _write(path, source)
    kernels = [s.name for s in sched.steps if isinstance(s, Kernel)]
    loaded = load_module(key, kernels)
    assert loaded is not None
    return loaded


def module_key(source: str) -> str:
    """The cache key of a Triton module: its text and triton's version.

    >>> len(module_key("import triton"))
    64
    """
    triton = _triton()  # (None where triton is missing: no module is ever loaded there)
    version = "none" if triton is None else triton.__version__
    return hashlib.sha256(f"{source}\0{version}".encode()).hexdigest()


def _module_path(key: str) -> Path:
    return cache.cache_dir() / "triton" / key[:2] / f"{key}.py"


def load_module(key: str, kernels: Sequence[str]) -> dict[str, Callable[..., Any]] | None:
    """The launchers of ``kernels`` from the cached module ``key`` (imported once a process),
    or None when the file is gone or lacks one of them (a graph-cache record then misses)."""
    path = _module_path(key)
    name = f"ember_triton_{key[:24]}"
    module = sys.modules.get(name)
    if module is None:
        if not path.is_file():
            return None
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton reads its kernels' source through the module
        try:
            spec.loader.exec_module(module)
        except Exception:  # a damaged file: compile again (and rewrite it)
            del sys.modules[name]
            return None
    launchers = {k: getattr(module, f"launch_{k}", None) for k in kernels}
    if any(fn is None for fn in launchers.values()):
        return None
    return launchers  # type: ignore[return-value]


def _write(path: Path, source: str) -> None:
    """Write ``path`` whole or not at all (a concurrent reader never sees half a module)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)
