"""``max_autotune``: time a few code-generation choices per graph, keep the fastest.

On CPU the choices are the C++ printer's (below); with the Triton printer they are its
block sizes and warps (:func:`triton_candidates`), timed the same way on the graph's
device, each call waiting for the GPU, and remembered under the GPU's name.

For a graph with kernels, :func:`choose` generates its C++ under each of
:func:`candidates`, each a :class:`~ember.inductor.knobs.Knobs` that changes one knob
from the default: the tile width of column kernels, the work below which a kernel stays
on one thread, the thread count of parallel loops (on machines with four threads or
more), and the matmul path of ``bias + a @ b`` (aten's addmm whole, or ``mm`` with the
bias add fused into its consumers; this one lowers the graph again). It builds each
distinct source (builds are cached on disk like any other), runs each on random inputs
of the graph's shapes, then also times the winners of each knob together, and keeps the
fastest. The choice is stored in ``<cache root>/inductor/autotune/<key>.json``, keyed by
the source under the default choices, the inputs' metadata and the machine, so another
process reuses it without timing again.

A graph with an integer input is not timed (random integers may be invalid indices, and
the generated code does not check bounds): it keeps the default choices, and says why in
its record.

>>> [k.tile for k in candidates(threads=8)][:3]
[16, 8, 32]
>>> [k.threads for k in candidates(threads=8)][-1], [k.threads for k in candidates(threads=2)][-1]
(4, 0)
>>> best = combined([(Knobs(), 3.0), (Knobs(tile=8), 2.0), (Knobs(addmm="aten"), 1.0)])
>>> best.tile, best.addmm
(8, 'aten')
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from ember.aotgraph.settings import cache_root
from ember.inductor import cache
from ember.inductor.knobs import Knobs

__all__ = [
    "Choice",
    "PerKernel",
    "candidates",
    "choose",
    "combined",
    "fastest_per_kernel",
    "triton_candidates",
]


def candidates(threads: int | None = None) -> tuple[Knobs, ...]:
    """The choices timed, the default first (a tie keeps it); ``threads`` is the thread
    count the kernels run with (default: torch's)."""
    n = torch.get_num_threads() if threads is None else threads
    fewer = (Knobs(threads=n // 2),) if n // 2 >= 2 else ()  # half the threads, when that
    # is still parallel (one thread is the "never parallel" choice)
    return (
        Knobs(),
        Knobs(tile=8),
        Knobs(tile=32),
        Knobs(parallel_min_work=1 << 14),  # parallel sooner
        Knobs(parallel_min_work=1 << 62),  # never parallel
        Knobs(addmm="aten"),
        *fewer,
    )


def triton_candidates() -> tuple[Knobs, ...]:
    """The Triton printer's choices, the default first: the points of a flat kernel's
    program, the elements of a row kernel's block, the warps of a program.

    >>> [(k.block, k.row_elements, k.warps) for k in triton_candidates()][:2]
    [(1024, 4096, 0), (256, 4096, 0)]
    """
    return (
        Knobs(),
        Knobs(block=256),
        Knobs(block=512),
        Knobs(block=2048),
        Knobs(row_elements=1024),
        Knobs(row_elements=16384),
        Knobs(warps=2),
        Knobs(warps=8),
        Knobs(matmul="template"),  # a graph without a matmul makes the default's code
    )


def combined(trials: Sequence[tuple[Knobs, float]]) -> Knobs:
    """Each knob at the value of the fastest trial that changed it, if that trial beat the
    default (``trials[0]``): the winners of each knob together."""
    default, default_s = trials[0]
    chosen: dict[str, Any] = {}
    for knobs, seconds in sorted(trials[1:], key=lambda trial: -trial[1]):  # fastest last
        if seconds < default_s:
            chosen |= {
                f.name: getattr(knobs, f.name)
                for f in fields(Knobs)
                if getattr(knobs, f.name) != getattr(default, f.name)
            }
    return replace(default, **chosen)


@dataclass(frozen=True, slots=True)
class Choice:
    """What autotuning chose for one graph, and what it measured (seconds per call);
    ``per_kernel``: kernels that run under knobs of their own (Triton)."""

    knobs: Knobs
    trials: tuple[tuple[Knobs, float], ...]
    cached: bool = False  # read from the disk record, not timed now
    why_not: str = ""  # set when the graph was not timed
    per_kernel: tuple[tuple[str, Knobs], ...] = ()


@dataclass(frozen=True)
class PerKernel:
    """How to choose knobs kernel by kernel (the Triton printer): ``times(source, inputs)``
    gives the seconds each kernel of one run took, ``mixed(knobs, per_kernel)`` the source
    with those kernels under their own knobs and the rest under ``knobs``."""

    times: Callable[[str, list[Any]], dict[str, float]]
    mixed: Callable[[Knobs, dict[str, Knobs]], str]


def fastest_per_kernel(
    best: Knobs, kernel_times: Sequence[tuple[Knobs, dict[str, float]]]
) -> dict[str, Knobs]:
    """For each kernel, the knobs of the trial that ran it fastest, where that is not ``best``.

    >>> mix = fastest_per_kernel(Knobs(), [(Knobs(), {"k0": 2.0, "k1": 1.0}),
    ...                                     (Knobs(block=256), {"k0": 1.0, "k1": 3.0})])
    >>> {name: k.block for name, k in mix.items()}
    {'k0': 256}
    """
    fastest: dict[str, tuple[float, Knobs]] = {}
    for chosen, times in kernel_times:
        for name, seconds in times.items():
            if name not in fastest or seconds < fastest[name][0]:
                fastest[name] = (seconds, chosen)
    return {name: k for name, (_, k) in fastest.items() if k != best}


def choose(
    sources: Callable[[Knobs], str],
    inputs: Sequence[Any],
    prepare: Callable[[str, list[Any]], Callable[[], Any]],
    trials: Sequence[Knobs] | None = None,
    per_kernel: PerKernel | None = None,
) -> Choice:
    """The fastest of ``trials`` (default :func:`candidates`) and their :func:`combined`
    winners: ``sources(knobs)`` is the code under a choice, ``prepare(source, inputs)`` a
    function that runs it once on ``inputs``. The distinct sources are timed in turns, best
    of :data:`ROUNDS`, so that a machine busy with other work slows them alike; on a GPU
    each call waits for the device. With ``per_kernel``, each kernel then gets the knobs
    of the trial (of the winner's lowering) that ran it fastest, and that mix is kept if
    the whole graph runs faster under it."""
    default = sources(Knobs())
    if any(isinstance(t, torch.Tensor) and not t.dtype.is_floating_point
           and t.dtype is not torch.bool for t in inputs):  # fmt: skip
        return Choice(Knobs(), (), why_not="an integer input: random values may be bad indices")
    path = cache_root() / "inductor" / "autotune" / f"{_key(default, inputs)}.json"
    if (stored := _load(path)) is not None:
        return stored
    try:
        real = [_random_like(t) for t in inputs]
        choice = _timed(default, sources, real, prepare, trials or candidates())
        if per_kernel is not None:
            choice = _per_kernel(choice, sources, real, prepare, per_kernel)
        _store(path, choice)
        return choice
    except Exception as e:  # a trial that fails must not fail the graph: keep the defaults
        return Choice(Knobs(), (), why_not=f"timing failed: {type(e).__name__}: {e}")


def _timed(
    default: str,
    sources: Callable[[Knobs], str],
    real: list[Any],
    prepare: Callable[[str, list[Any]], Callable[[], Any]],
    trials: Sequence[Knobs],
) -> Choice:
    tried: dict[Knobs, float] = {}
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in real):
        prepare = _waiting(prepare)
    timed: dict[str, float] = {}  # choices that make the same code share its time

    def time_all(choices: Sequence[Knobs]) -> None:
        source_of = {k: default if k == Knobs() else sources(k) for k in choices}
        new = [src for src in dict.fromkeys(source_of.values()) if src not in timed]
        calls = {src: prepare(src, real) for src in new}  # the builds run side by side
        timed.update(dict.fromkeys(calls, float("inf")))
        for _ in range(ROUNDS):
            for src, call in calls.items():
                timed[src] = min(timed[src], seconds_per_call(call))
        tried.update({k: timed[src] for k, src in source_of.items() if k not in tried})

    time_all(trials)
    time_all([combined(list(tried.items()))])  # the winners of each knob together
    best = min(tried.items(), key=lambda trial: trial[1])[0]
    return Choice(best, tuple(tried.items()))


def _per_kernel(
    choice: Choice,
    sources: Callable[[Knobs], str],
    real: list[Any],
    prepare: Callable[[str, list[Any]], Callable[[], Any]],
    per_kernel: PerKernel,
) -> Choice:
    """``choice`` with kernels under the knobs that ran each fastest, if the graph then
    runs faster than under ``choice.knobs`` alone (timed in turns against it)."""
    best = choice.knobs
    same = [k for k, _ in choice.trials if k.lowering == best.lowering]  # same kernels
    kernel_times = [(k, per_kernel.times(sources(k), real)) for k in same]
    mapping = fastest_per_kernel(best, kernel_times)
    if not mapping:
        return choice
    if any(isinstance(t, torch.Tensor) and t.is_cuda for t in real):
        prepare = _waiting(prepare)
    calls = [prepare(sources(best), real), prepare(per_kernel.mixed(best, mapping), real)]
    seconds = [float("inf")] * 2
    for _ in range(ROUNDS):
        for i, call in enumerate(calls):
            seconds[i] = min(seconds[i], seconds_per_call(call))
    if seconds[1] >= seconds[0]:
        return choice
    return replace(choice, per_kernel=tuple(sorted(mapping.items())))


def _waiting(
    prepare: Callable[[str, list[Any]], Callable[[], Any]],
) -> Callable[[str, list[Any]], Callable[[], Any]]:
    """``prepare`` whose calls wait for the GPU: a kernel launch returns before it runs."""

    def prepared(source: str, inputs: list[Any]) -> Callable[[], Any]:
        call = prepare(source, inputs)

        def waited() -> None:
            call()
            torch.cuda.synchronize()

        return waited

    return prepared


def _key(source: str, inputs: Sequence[Any]) -> str:
    meta = [
        (tuple(t.shape), tuple(t.stride()), str(t.dtype)) if isinstance(t, torch.Tensor) else t
        for t in inputs
    ]
    gpus = sorted({t.device for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda}, key=str)
    machine = [torch.cuda.get_device_name(d) for d in gpus] or cache._cpu_id()
    text = f"{source}\n{meta!r}\n{machine}\n{torch.get_num_threads()}"
    return hashlib.sha256(text.encode()).hexdigest()


def _random_like(t: Any) -> Any:
    """Random values with ``t``'s shape, strides (overlapping ones included) and dtype."""
    if not isinstance(t, torch.Tensor):
        return t
    size = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    size = size if all(n > 0 for n in t.shape) else 0
    if t.dtype is torch.bool:
        base = torch.zeros(size, dtype=t.dtype, device=t.device)
    else:
        base = torch.randn(size, device=t.device)
    return base.to(t.dtype).as_strided(tuple(t.shape), tuple(t.stride()))


def _load(path: Any) -> Choice | None:
    try:
        record = json.loads(path.read_text())
        trials = tuple((Knobs(**k), s) for k, s in record["trials"])
        mixed = tuple((name, Knobs(**k)) for name, k in record.get("per_kernel", []))
        return Choice(Knobs(**record["knobs"]), trials, cached=True, per_kernel=mixed)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(path: Any, choice: Choice) -> None:
    record = {
        "knobs": asdict(choice.knobs),
        "trials": [(asdict(k), s) for k, s in choice.trials],
        "per_kernel": [(name, asdict(k)) for name, k in choice.per_kernel],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


ROUNDS = 5  # turns over the candidates; each candidate's best turn counts


def timed_launcher(
    launch: Callable[..., Any], name: str, spent: dict[str, list[Any]], cuda: bool
) -> Callable[..., Any]:
    """``launch`` noting into ``spent[name]`` how long each call took: CUDA events around
    it on a GPU (read by :func:`kernel_seconds` once the device is done), else seconds."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        if cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            out = launch(*args, **kwargs)
            end.record()
            spent.setdefault(name, []).append((start, end))
            return out
        begin = time.perf_counter()
        out = launch(*args, **kwargs)
        spent.setdefault(name, []).append(time.perf_counter() - begin)
        return out

    return timed


def kernel_seconds(
    call: Callable[[], Any], spent: dict[str, list[Any]], cuda: bool
) -> dict[str, float]:
    """Seconds each kernel took in one run of ``call`` (whose launchers note into ``spent``:
    :func:`timed_launcher`), best of :data:`ROUNDS` runs after one that builds them."""
    call()
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        spent.clear()
        call()
        if cuda:
            torch.cuda.synchronize()
        for name, marks in spent.items():
            took = sum(m[0].elapsed_time(m[1]) / 1e3 if cuda else m for m in marks)
            best[name] = min(best.get(name, float("inf")), took)
    return best


def seconds_per_call(call: Callable[[], Any], budget: float = 0.02) -> float:
    """Seconds per ``call()``, over as many calls as fit in ``budget`` (at least one),
    after a warm-up call (the first builds and loads the library)."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    n = max(1, min(1000, int(budget / once)))
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n
