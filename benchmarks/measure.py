"""One benchmark measurement in a fresh process: a workload under one configuration.

    python benchmarks/measure.py WORKLOAD CONFIG PHASE OUT_PREFIX [--quick] [--threads N]

``benchmarks/run.py`` starts this script once per workload, configuration and
phase, each in its own process with the same environment. A configuration is
``eager``, ``ember:<backend>`` or ``torch:<backend>`` (``torch.compile``, the
peer). The ``cold`` phase times the first call (compile with empty caches),
saves the results of the first steps for the correctness check
(``OUT_PREFIX.pt``), times the steady state and reads the peak memory. The
``warm`` phase times the first call again with the cache folders the cold
process left, the steady state again (a second process, so the spread between
processes shows), and the per-call overhead. The measurements go to
``OUT_PREFIX.json``; an exception leaves a traceback on stderr and exit status 1.

Before the first call a process has imported torch and the workload (its
program, and what building it imports: a ``torch.optim`` optimizer imports
``torch._dynamo``, transformers its own modules), nothing else. Each
configuration pays its own imports inside the timed first call, as a user
meets them in a new process: ``import ember.compiler`` and whatever ember loads
lazily while compiling (fake tensors, sympy, ...), or ``torch.compile``'s
``import torch._dynamo`` and its lazy imports. ``import_s`` is the part of the
first call spent before the program first runs (the import and the wrapping
call), so ``first_call_s - import_s`` is the first call once the configuration's
module is imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from workloads import WORKLOADS, Prepared, Program

# How many steps the correctness check compares (losses and parameters after them).
CHECK_STEPS = {"infer": 2, "train": 3, "step": 3}
# A timing attempt is accepted when its samples spread less than this (interquartile
# range over median), the calibration loop ran as fast after it as before (within
# DRIFT_OK), and, if timed by the wall clock, other processes kept fewer than LOAD_OK
# cores busy.
SPREAD_OK = 0.05
DRIFT_OK = 0.05
LOAD_OK = 0.5
ATTEMPTS = {False: 3, True: 1}  # quick -> timing attempts
REPEATS = {False: 15, True: 5}  # quick -> samples per attempt
SAMPLE_S = {False: 0.02, True: 0.005}  # quick -> the least time one sample covers


# --- load and memory: what /proc says -------------------------------------------------


def cpu_busy() -> tuple[float, float, float]:
    """(wall seconds, CPU seconds busy on the whole machine, CPU seconds of this process)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), (sum(fields[:8]) - idle) / tick, time.process_time()


def other_load(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores kept busy by other processes between two ``cpu_busy()`` readings."""
    wall = after[0] - before[0]
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others / wall) if wall > 0 else 0.0


def status_kib(key: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> bool:
    """Reset this process's RSS high-water mark to its current RSS (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Calibration:
    """A fixed memory-bound loop (adding two 16 MiB tensors) timed before and after each attempt.

    Its time changes when something else on the machine competes for memory
    bandwidth or caches, which this thread's CPU time does not show. The
    tensors are allocated once, first thing in the process, alike for every
    configuration.
    """

    def __init__(self) -> None:
        n = 4 << 20  # every page written now, so the calibration never adds to peak memory
        self.a, self.b, self.out = torch.ones(n), torch.ones(n), torch.zeros(n)

    def __call__(self) -> float:
        """Seconds of one add (best of 3, by :func:`clock`)."""
        tick, times = clock(), []
        for _ in range(3):
            start = tick()
            torch.add(self.a, self.b, out=self.out)
            times.append(tick() - start)
        return min(times)


CALIBRATE: Calibration | None = None


# --- timing -------------------------------------------------------------------------


def clock() -> Callable[[], float]:
    """The clock of steady-state timings: this thread's CPU time when torch runs one thread.

    With one intra-op thread all of a step's work runs on the calling thread, so
    its CPU time is its wall time on an idle machine, minus the time other
    processes took the core away (on a shared machine, the main source of noise).
    With more threads only wall time counts them all.
    """
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


@dataclass
class Timing:
    """The steady state of one step: per-call seconds of the accepted attempt, and how noisy."""

    median_s: float  # by clock(): thread CPU time at one thread, else wall time
    wall_median_s: float
    spread: float  # interquartile range / median of the samples
    load: float  # cores other processes kept busy meanwhile
    calls_per_sample: int
    clock: str
    calibration_s: tuple[float, float]  # the calibration loop before and after
    attempts: list[dict[str, float]] = field(default_factory=list)

    @property
    def drift(self) -> float:
        before, after = self.calibration_s
        return abs(after - before) / min(before, after) if min(before, after) > 0 else 0.0

    @property
    def noisy(self) -> bool:
        loaded = self.clock == "wall" and self.load > LOAD_OK
        return self.spread > SPREAD_OK or self.drift > DRIFT_OK or loaded


def sample(step: Callable[[], Any], calls: int, repeats: int) -> list[tuple[float, float]]:
    """``repeats`` samples of one step's mean time over ``calls`` calls: (clock(), wall)."""
    tick = clock()
    out = []
    for _ in range(repeats):
        start, wall = tick(), time.perf_counter()
        for _ in range(calls):
            step()
        out.append(((tick() - start) / calls, (time.perf_counter() - wall) / calls))
    return out


def attempt(step: Callable[[], Any], calls: int, quick: bool) -> Timing:
    """One timing attempt: samples, their median and spread, other load, calibration drift."""
    calibrate: Callable[[], float] = CALIBRATE or (lambda: 0.0)
    before, calibrated = cpu_busy(), calibrate()
    samples = sample(step, calls, REPEATS[quick])
    calibration = (calibrated, calibrate())
    load = other_load(before, cpu_busy())
    q1, median, q3 = statistics.quantiles([s for s, _ in samples], n=4)
    wall = statistics.median(w for _, w in samples)
    name = "thread cpu" if clock() is time.thread_time else "wall"
    return Timing(median, wall, (q3 - q1) / median, load, calls, name, calibration)


def steady_state(step: Callable[[], Any], quick: bool) -> Timing:
    """Median time of one step after warm-up; noisy attempts are repeated, the best one kept."""
    for _ in range(2):
        step()
    once = min(s for s, _ in sample(step, 1, 3))
    calls = max(1, round(SAMPLE_S[quick] / max(once, 1e-7)))
    tries: list[Timing] = []
    while len(tries) < ATTEMPTS[quick] and not (tries and not tries[-1].noisy):
        tries.append(attempt(step, calls, quick))
    best = min(tries, key=lambda t: (t.noisy, t.median_s))
    best.attempts = [
        {"median_s": t.median_s, "spread": t.spread, "load": t.load, "drift": t.drift}
        for t in tries
    ]
    return best


def first_call(prepared: Prepared, config: str) -> tuple[float, float, Any]:
    """Compile the program as ``config`` says and run the first step, timed as a user meets it.

    Returns (seconds importing the compiler and wrapping the program, seconds of the
    whole first call: those, capture, compile and one run, the step's result).
    """
    start = time.perf_counter()
    prepared.compile(compiler_for(config))  # imports ember.compiler / torch._dynamo
    wrapped = time.perf_counter()
    result = prepared.step()
    return wrapped - start, time.perf_counter() - start, result


# --- configurations: eager, ember, torch.compile --------------------------------------


def _ember() -> Any:
    import ember.compiler

    return ember.compiler


def _dynamo() -> Any:
    import torch._dynamo

    return torch._dynamo


# kind -> (make(program, backend, mode) -> compiled, reset caches, look a backend name up)
KINDS: dict[str, tuple[Callable[..., Any], Callable[[], None], Callable[[str], Any]]] = {
    "eager": (lambda p, b, mode, dynamic=None, options=None: p, lambda: None, lambda name: None),
    "ember": (
        lambda p, b, mode, dynamic=None, options=None: _ember().compile(
            p, backend=b, mode=mode, dynamic=dynamic, options=options
        ),
        lambda: _ember().reset(),
        lambda name: _ember().lookup_backend(name),
    ),
    "torch": (
        lambda p, b, mode, dynamic=None, options=None: torch.compile(
            p, backend=b, mode=mode, dynamic=dynamic, options=options
        ),
        lambda: _dynamo().reset(),
        lambda name: _dynamo().lookup_backend(name),
    ),
}


def split_config(config: str) -> tuple[str, str]:
    """``"ember:eager"`` -> ``("ember", "eager")``; ``"eager"`` -> ``("eager", "")``; a mode
    (``"ember:inductor@max-autotune"``, see :func:`config_mode`) and ``+dynamic`` (see
    :func:`config_dynamic`) are not part of either.

    >>> split_config("torch:inductor+dynamic@max-autotune")
    ('torch', 'inductor')
    """
    kind, _, backend = config.partition("@")[0].partition(":")
    return kind, backend.partition("+")[0]


def config_dynamic(config: str) -> bool | None:
    """``dynamic=True`` for a configuration ending its backend with ``+dynamic``, else the
    default (None: automatic dynamic).

    >>> config_dynamic("ember:inductor+dynamic"), config_dynamic("ember:inductor")
    (True, None)
    """
    return True if "+dynamic" in config.partition("@")[0] else None


def config_mode(config: str) -> str | None:
    """The ``mode`` passed to the compiler: what follows ``@`` in the configuration.

    >>> config_mode("ember:inductor@max-autotune"), config_mode("ember:inductor")
    ('max-autotune', None)
    """
    return config.partition("@")[2] or None


def config_options(config: str) -> dict[str, Any] | None:
    """The backend ``options`` of a configuration: ``+freezing`` asks for inference freezing
    (``{"freezing": True}``, a setting both ember's and torch's inductor have).

    >>> config_options("ember:inductor+freezing"), config_options("torch:inductor")
    ({'freezing': True}, None)
    """
    return {"freezing": True} if "+freezing" in config.partition("@")[0] else None


def compiler_for(config: str, backend: Any = None) -> Callable[[Program], Any]:
    """A function that compiles a program as ``config`` says (``backend`` overrides the name)."""
    kind, name = split_config(config)
    make, mode, dynamic = KINDS[kind][0], config_mode(config), config_dynamic(config)
    options = config_options(config)
    return lambda program: make(
        program, backend if backend is not None else name, mode, dynamic, options
    )


# --- graphs, breaks and per-call overhead ---------------------------------------------


def _ember_graphs(compiled: Any) -> dict[str, Any]:
    """Graphs ember compiled; graph breaks and frames that ran eagerly, with their reasons."""
    stats = compiled.stats
    breaks = list(getattr(stats, "breaks", []))  # graph breaks (issue 5) where ember has them
    notes = {f"break ({f.category}): {f.reason}" for f in breaks}
    notes |= {f"eager frame ({f.category}): {f.reason}" for f in stats.failures}
    return {
        "graphs": stats.graphs,
        "breaks": len(breaks) + len(stats.failures),
        "graph_breaks": len(breaks),
        "eager_frames": len(stats.failures),
        "ops": sum(c.ops for c in stats.compiled),
        "notes": sorted(notes),
    }


def _torch_graphs(compiled: Any) -> dict[str, Any]:
    """Graphs torch.compile made, and its graph breaks with their reasons (dynamo's counters)."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    frames = counters["frames"]
    eager = frames["total"] - frames["ok"]
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(breaks.values()) + eager,
        "graph_breaks": sum(breaks.values()),
        "eager_frames": eager,
        "ops": counters["stats"]["calls_captured"],
        "notes": sorted({"break: " + reason.splitlines()[0] for reason in breaks}),
    }


GRAPH_STATS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "eager": lambda compiled: {"graphs": None, "breaks": None, "notes": []},
    "ember": _ember_graphs,
    "torch": _torch_graphs,
}


class GraphTimer:
    """A backend wrapper that counts graphs and adds up the seconds spent running them."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.graphs = 0
        self.inside = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        fn = self.inner(gm, example_inputs)
        self.graphs += 1

        tick = clock()

        def timed(*args: Any) -> Any:
            start = tick()
            try:
                return fn(*args)
            finally:
                self.inside += tick() - start

        if getattr(fn, "_boxed_call", False):  # torch passes such a function one list
            timed._boxed_call = True  # type: ignore[attr-defined]
        return timed


def overhead(prepared: Prepared, config: str, quick: bool) -> float | None:
    """Seconds per forward call spent outside the compiled graphs (median of 15 samples).

    Compiles the program again with the configuration's backend wrapped in a
    :class:`GraphTimer`; the time of a call minus the time inside its graphs
    is what the compiler adds around them: the frame hook, the guard check,
    gathering the graph inputs, rebuilding the outputs (and, where the program
    has graph breaks, the Python run between graphs). ``None`` when no graph ran.
    """
    kind, name = split_config(config)
    make, reset, lookup = KINDS[kind]
    reset()
    timer = GraphTimer(lookup(name))
    # the mode needs a backend named, not wrapped; dynamic=True as the configuration says
    fn = make(prepared.program, timer, None, config_dynamic(config))
    for _ in range(3):
        prepared.forward(fn)
    once = min(s for s, _ in sample(lambda: prepared.forward(fn), 1, 3))
    calls = max(1, round(SAMPLE_S[quick] / max(once, 1e-7)))
    tick = clock()
    per_call = []
    for _ in range(15):
        kept = []  # freeing an output (and its autograd graph) is no part of the call
        timer.inside = 0.0
        start = tick()
        for _ in range(calls):
            kept.append(prepared.forward(fn))
        per_call.append((tick() - start - timer.inside) / calls)
        del kept
    return statistics.median(per_call) if timer.graphs else None


# --- the two phases -------------------------------------------------------------------


def cold(prepared: Prepared, config: str, quick: bool, prefix: str) -> dict[str, Any]:
    """First call with empty caches, results for the correctness check, steady state, memory."""
    peak_reset = reset_peak()
    base = status_kib("VmRSS")
    import_s, seconds, result = first_call(prepared, config)
    results = [result] + [prepared.step() for _ in range(CHECK_STEPS[prepared.mode] - 1)]
    saved = {"results": results, "state": prepared.state(), "grads": prepared.grads()}
    torch.save({**saved, "drift": prepared.drift(len(results))}, prefix + ".pt")
    timing = steady_state(prepared.step, quick)
    peak = status_kib("VmHWM") - base
    return {
        "first_call_s": seconds,
        "import_s": import_s,
        "timing": {**asdict(timing), "drift": timing.drift},
        "noisy": timing.noisy,
        "peak_mib": peak / 1024,
        "peak_mode": "reset" if peak_reset else "since start",
        "rss_mib": base / 1024,
        **GRAPH_STATS[split_config(config)[0]](prepared.callable),
    }


def warm(prepared: Prepared, config: str, quick: bool, prefix: str) -> dict[str, Any]:
    """First call with the cold process's caches, steady state again, per-call overhead."""
    import_s, seconds, _ = first_call(prepared, config)
    timing = steady_state(prepared.step, quick)
    graphs = GRAPH_STATS[split_config(config)[0]](prepared.callable)
    compiled = split_config(config)[0] != "eager"
    return {
        "first_call_s": seconds,
        "import_s": import_s,
        "timing": {**asdict(timing), "drift": timing.drift},
        "noisy": timing.noisy,
        "overhead_s": overhead(prepared, config, quick) if compiled else None,
        **graphs,
    }


PHASES = {"cold": cold, "warm": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("config", help="eager | ember:<backend> | torch:<backend>")
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("prefix", help="write PREFIX.json (and PREFIX.pt in the cold phase)")
    parser.add_argument("--quick", action="store_true", help="the smoke-run sizes and repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global CALIBRATE
    CALIBRATE = Calibration()
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # graph-break warnings
    # Only torch and the workload are imported before the first call (see the docstring).
    prepared = WORKLOADS[args.workload].prepare(quick=args.quick)
    result = PHASES[args.phase](prepared, args.config, args.quick, args.prefix)
    result |= {"threads": torch.get_num_threads()}
    with open(args.prefix + ".json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
