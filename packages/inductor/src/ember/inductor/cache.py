"""Compile C++ with the system compiler, cache the shared library on disk, load it.

Entries live in ``$EMBER_CACHE_DIR/inductor/<key[:2]>/<key>/`` (default
``~/.cache/ember``), keyed by a hash of the source, the compiler's path and
version, the flags, the CPU (flags may say ``-march=native``) and the ember
and torch versions. An entry is built in a private temporary folder and
renamed into place, so readers never see half an entry; its ``ok`` file
records the key and the library's checksum, and an entry whose ``ok`` does
not match (corrupt, truncated, foreign) is deleted and rebuilt, never loaded.
Builds run on a thread pool, so several graphs compile in parallel.

>>> key = cache_key("int f() { return 1; }", CompileOptions())
>>> len(key)
64
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ember.aotgraph.settings import cache_root
from ember.inductor import settings
from ember.inductor.timing import TIMES

__all__ = [
    "DEFAULT_CFLAGS",
    "CompileError",
    "CompileOptions",
    "build",
    "cache_dir",
    "cache_key",
    "load",
]

# -ffast-math is left out on purpose: it lets the compiler assume no NaN or inf, which breaks
# isnan, NaN-propagating max/min and inf constants. These two are safe: no errno, no traps.
DEFAULT_CFLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
    "-std=c++17",
    "-w",
)
if ctypes.util.find_library("mvec"):  # glibc's vector math: see PRELUDE in codegen_cpp
    # sin and cos stop being builtins, so gcc no longer merges sin(x) and cos(x) into a scalar
    # sincos call; the prelude's ember_sin/ember_cos call libmvec's vector versions instead
    NO_SINCOS = ("-fno-builtin-sin", "-fno-builtin-cos", "-fno-builtin-sinf", "-fno-builtin-cosf")
    DEFAULT_CFLAGS = (*DEFAULT_CFLAGS, "-DEMBER_MVEC", *NO_SINCOS, "-lmvec")


class CompileError(RuntimeError):
    """The C++ compiler rejected generated code; the message holds its output."""


@dataclass(frozen=True)
class CompileOptions:
    """How generated C++ is compiled: the compiler and its flags."""

    cxx: str = field(default_factory=lambda: settings.section.get().cxx)
    cflags: tuple[str, ...] = DEFAULT_CFLAGS

    @classmethod
    def resolve(cls, opts: dict[str, Any]) -> CompileOptions:
        """From a backend's ``options`` (``cxx``, ``cflags``) over the settings: the flags
        always build a loadable library (``-shared -fPIC``), ``extra_cflags`` go last.

        >>> CompileOptions.resolve({"cflags": ["-O1"]}).cflags[:3]
        ('-O1', '-shared', '-fPIC')
        """
        now = settings.section.get()
        flags = tuple(opts.get("cflags", now.cflags or DEFAULT_CFLAGS))
        flags += tuple(f for f in ("-shared", "-fPIC") if f not in flags) + now.extra_cflags
        return cls(cxx=opts.get("cxx", now.cxx), cflags=flags)


def cache_dir() -> Path:
    """Where compiled kernels live: ``$EMBER_CACHE_DIR/inductor``; without it, ``ember`` in
    the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    return cache_root() / "inductor"


@functools.cache
def _compiler_id(cxx: str) -> str:
    path = shutil.which(cxx) or cxx
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        version = out.stdout.splitlines()[0] if out.stdout else out.stderr
    except OSError:
        version = "missing"
    return f"{os.path.realpath(path)} {version}"


@functools.cache
def _cpu_id() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
        return hashlib.sha256("\n".join(sorted(set(lines))).encode()).hexdigest()[:16]
    except OSError:
        return platform.processor()


def cache_key(source: str, options: CompileOptions) -> str:
    """The hash that names a compiled library."""
    from ember.inductor import __version__

    parts = [
        source,
        _compiler_id(options.cxx),
        list(options.cflags),
        _cpu_id(),
        platform.machine(),
        __version__,
        torch.__version__,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def valid(entry: Path, key: str) -> bool:
    """Whether ``entry`` holds a complete library for ``key`` (checksum checked)."""
    try:
        marker = json.loads((entry / "ok").read_text())
        return bool(marker["key"] == key and marker["sha256"] == _checksum(entry / "kernels.so"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build(source: str, options: CompileOptions | None = None) -> tuple[Path, str, bool]:
    """Compile ``source`` (or find it cached): the library's path, the command, cache hit."""
    options = options or CompileOptions()
    key = cache_key(source, options)
    entry = cache_dir() / key[:2] / key
    command = [options.cxx, *options.cflags, "kernels.cpp", "-o", "kernels.so"]
    if valid(entry, key):
        return entry / "kernels.so", " ".join(command), True
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
    try:
        (tmp / "kernels.cpp").write_text(source)
        with TIMES.timed("C++ build"):  # for ember.compiler.compile_times()
            done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CompileError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
        marker = {"key": key, "sha256": _checksum(tmp / "kernels.so")}
        (tmp / "ok").write_text(json.dumps(marker))
        _install(tmp, entry, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry / "kernels.so", " ".join(command), False


def _install(tmp: Path, entry: Path, key: str) -> None:
    """Rename the built ``tmp`` to ``entry``, atomically. An entry already there is another
    build's (a thread's or a process's, of the same source): kept if valid, else moved
    aside and replaced. An entry is never deleted where it stands: a build that found none
    and removed what was there by the time it looked again deleted a library another build
    had just installed and was about to load."""
    for _ in range(3):
        try:
            os.rename(tmp, entry)
            return
        except OSError:
            if valid(entry, key):  # another build won the race; its entry is as good as ours
                return
            trash = entry.with_name(f".trash-{os.getpid()}-{threading.get_ident()}-{key[:8]}")
            try:
                os.rename(entry, trash)  # corrupt or foreign: aside, then gone
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not install the kernel library at {entry}")


_POOL = ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 2), thread_name_prefix="ember-cxx")
_LOADED: dict[Path, ctypes.CDLL] = {}
_LOCK = threading.Lock()


_IN_FLIGHT: set[Future[Any]] = set()


def build_async(
    source: str, options: CompileOptions | None = None
) -> Future[tuple[Path, str, bool]]:
    """:func:`build` on the compile pool."""
    future = _POOL.submit(build, source, options)
    track(future)
    return future


def track(future: Future[Any]) -> None:
    """Count ``future`` among the builds :func:`wait_for_builds` waits for (C++ builds, and
    Triton kernels built in the background: :mod:`ember.inductor.background`)."""
    with _LOCK:
        _IN_FLIGHT.add(future)
    future.add_done_callback(_landed)


def _landed(future: Future[Any]) -> None:
    with _LOCK:
        _IN_FLIGHT.discard(future)


def wait_for_builds() -> None:
    """Wait until every build submitted so far has finished (or failed): C++ libraries,
    and Triton kernels built in the background (time kernels only after this).

    ``ember.compiler.reset()`` calls it before it forgets the compile times: a build still
    queued on the pool (a backward graph nobody ran yet) would otherwise start, and be
    counted, after the reset.

    >>> wait_for_builds()
    """
    with _LOCK:
        running = list(_IN_FLIGHT)
    wait(running)


def load(path: Path) -> ctypes.CDLL:
    """Load a compiled library once per process."""
    with _LOCK, TIMES.timed("load"):
        lib = _LOADED.get(path)
        if lib is None:
            lib = _LOADED[path] = ctypes.CDLL(str(path))
        return lib
