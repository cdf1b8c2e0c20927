"""Cold compile time over depth: how much each added transformer layer costs to compile.

    python3 benchmarks/bench_depth.py                          # gpt2, depths 2 6 12 24, infer
    python3 benchmarks/bench_depth.py --model llama --depths 2,12 --configs ember,torch
    python3 benchmarks/bench_depth.py --repeats 3 --out bench-results/depth.json

A transformer stack repeats one layer N times, so a compiler that lowers and
builds each repetition anew pays for every layer again. This script builds a
real-model workload of ``benchmarks/models/hf.py`` (a tiny random-init
transformers model at its full benchmark size) with its number of layers
varied, and times the first call of each configuration in a fresh process with
empty cache folders, as ``benchmarks/run.py`` times its *cold* column: the
import of the compiler, the wrapping call and the first call, minus one
steady-state call. It prints the table and the slope of cold compile time over
depth (seconds per added layer, a least-squares line through the depths) for
each configuration, and the ratio of ember's slope to torch's.

Configurations:

- ``ember``: ``ember.compiler.compile(model)``, no annotation;
- ``ember-nomemo``: the same with aotgraph's per-op trace memo off (the ``trace_memo``
  setting), to measure what it saves;
- ``ember-nofreeze``: ember with capture's frozen heap during compiles off (the
  ``freeze_heap`` setting, ``ember.capture.gcpause``), likewise;
- ``torch``: ``torch.compile(model)``;
- ``torch-nested``: ``torch.compile(model)`` with the layer's class marked by
  ``torch.compiler.nested_compile_region`` (the user names the repeated region:
  the class of the modules in the model's ``ModuleList`` of ``depth`` layers).

Each process runs one thread (``--threads``) with the runner's environment
(``run.child_env``: allocator settings, ``EMBER_CHECK=0``, its own cache
folders). With ``--repeats N`` every (configuration, depth) runs N times,
interleaved, and the smallest cold time is kept (best of N: the noise of a
shared machine only ever adds). Besides wall seconds, each process reports
its CPU seconds (its own and those of the children it waited for, the C++
compiler runs), minus a steady call's; ember's also the thread CPU seconds
of each compile phase of its first call (capture, aot trace, lowering, ...),
tabled per depth with their slopes.

>>> fit([(2, 1.0), (6, 3.0), (12, 6.0)])  # seconds per layer, seconds at depth 0
(0.5, 0.0)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIGS = ("ember", "torch", "torch-nested")
STEADY_CALLS = 5  # steady-state calls after the first; their median is subtracted


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line ``seconds = slope * depth + intercept`` through ``points``."""
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return slope, my - slope * mx


# --- the child: one (configuration, depth) in a fresh process ------------------------


def build(model: str, depth: int) -> tuple[Any, dict[str, Any]]:
    """A random-init transformers model of ``depth`` layers (the rest at its full benchmark
    size) and its inputs, both from seed 0."""
    import torch
    import transformers
    from models.hf import ATTENTION, HF_MODELS

    spec = HF_MODELS[model]
    sizes = dataclasses.replace(spec.full, layers=depth)
    torch.manual_seed(0)
    config = spec.config(sizes)
    config._attn_implementation = ATTENTION
    net = getattr(transformers, spec.model_class)(config)
    return net, spec.inputs(sizes)


def layer_classes(net: Any, depth: int) -> set[type]:
    """The classes of the repeated layers: those in a ``ModuleList`` of ``depth`` modules."""
    from torch import nn

    return {
        type(m)
        for lst in net.modules()
        if isinstance(lst, nn.ModuleList) and len(lst) == depth
        for m in lst
    }


def _ember(net: Any, depth: int) -> Any:
    import ember.compiler

    return ember.compiler.compile(net)


def _ember_nomemo(net: Any, depth: int) -> Any:
    """ember with aotgraph's per-op trace memo off (``trace_memo``), for comparison."""
    os.environ["EMBER_AOT_TRACE_MEMO"] = "0"
    return _ember(net, depth)


def _ember_nofreeze(net: Any, depth: int) -> Any:
    """ember without capture's frozen heap during compiles (``freeze_heap``), for comparison."""
    os.environ["EMBER_CAPTURE_FREEZE_HEAP"] = "0"
    return _ember(net, depth)


def _torch(net: Any, depth: int) -> Any:
    import torch

    return torch.compile(net)


def _torch_nested(net: Any, depth: int) -> Any:
    import torch

    for cls in layer_classes(net, depth):  # as a user would decorate the layer's forward
        cls.forward = torch.compiler.nested_compile_region(cls.forward)
    return torch.compile(net)


WRAP: dict[str, Callable[[Any, int], Any]] = {
    "ember": _ember,
    "ember-nomemo": _ember_nomemo,
    "ember-nofreeze": _ember_nofreeze,
    "torch": _torch,
    "torch-nested": _torch_nested,
}


def cpu() -> float:
    """CPU seconds of this process, of its children that have been waited for (ember's C++
    compiler runs), and of its live descendants (torch's compile worker pool, whose
    processes outlive the first call)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + descendants_cpu()


def descendants_cpu() -> float:
    """CPU seconds of this process's live descendants (theirs and their reaped children's)."""
    parent, busy = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        pid = int(stat.parent.name)
        parent[pid] = int(fields[1])
        busy[pid] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    todo, total = list(children.get(os.getpid(), [])), 0
    while todo:
        pid = todo.pop()
        total += busy[pid]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def thread_phases() -> dict[str, float]:
    """From now on, sum the thread CPU seconds of each of ember's compile phases (the blocks
    its packages time with ``Recorder.timed``) into the returned dict, by phase name. A
    phase timed inside another counts in both ("backend" holds "aot trace")."""
    import ember.aotgraph.timing
    import ember.guards.timing

    spent: dict[str, float] = {}
    for cls in {ember.guards.timing.Recorder, ember.aotgraph.timing.Recorder}:
        plain = cls.timed

        def timed(self: Any, phase: str, plain: Any = plain) -> Any:
            return _thread_timed(plain(self, phase), phase, spent)

        cls.timed = timed  # type: ignore[method-assign]
    return spent


def collections_timed() -> dict[str, float]:
    """From now on, count the garbage collector's runs and their thread CPU seconds in the
    returned dict: ``full`` and ``full_s`` for generation 2, ``young`` and ``young_s``."""
    out = {"full": 0.0, "full_s": 0.0, "young": 0.0, "young_s": 0.0}
    start = [0.0]

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            start[0] = time.thread_time()
            return
        kind = "full" if info["generation"] == 2 else "young"
        out[kind] += 1
        out[kind + "_s"] += time.thread_time() - start[0]

    gc.callbacks.append(note)
    return out


class _thread_timed:
    """``block``, with the thread CPU time spent in it added to ``spent[phase]``."""

    def __init__(self, block: Any, phase: str, spent: dict[str, float]) -> None:
        self.block, self.phase, self.spent = block, phase, spent

    def __enter__(self) -> Any:
        self.start = time.thread_time()
        return self.block.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        took = time.thread_time() - self.start
        self.spent[self.phase] = self.spent.get(self.phase, 0.0) + took
        return self.block.__exit__(*exc)


def child(config: str, model: str, depth: int, mode: str) -> dict[str, Any]:
    """Time the first call (import, wrap, capture, compile, one run) and steady calls."""
    import torch

    spent = thread_phases() if config.startswith("ember") else {}
    collected = collections_timed()

    net, inputs = build(model, depth)
    net.train(mode == "train")

    def step(fn: Any) -> None:
        if mode == "infer":
            with torch.no_grad():
                fn(**inputs)
        else:
            fn(**inputs).logits.sum().backward()

    wall0, cpu0 = time.perf_counter(), cpu()
    compiled = WRAP[config](net, depth)
    step(compiled)
    first_wall, first_cpu = time.perf_counter() - wall0, cpu() - cpu0
    gc.callbacks.clear()  # the first call's collections only
    walls, cpus = [], []
    for _ in range(STEADY_CALLS):
        w, c = time.perf_counter(), cpu()
        step(compiled)
        walls.append(time.perf_counter() - w)
        cpus.append(cpu() - c)
    steady_wall, steady_cpu = statistics.median(walls), statistics.median(cpus)
    out = {
        "first_call_s": first_wall,
        "steady_s": steady_wall,
        "cold_s": max(0.0, first_wall - steady_wall),
        "cold_cpu_s": max(0.0, first_cpu - steady_cpu),
    }
    if config.startswith("ember"):
        import ember.compiler

        times = ember.compiler.compile_times()
        out["phases"] = {phase: times[phase][1] for phase in times}
        out["thread_phases"] = dict(spent)  # the first call's: steady calls compile nothing
        out["gc"] = dict(collected)
    return out


# --- the parent: every (configuration, depth), each in its own process ---------------


def run_one(args: argparse.Namespace, config: str, depth: int) -> dict[str, Any]:
    """One fresh process with empty cache folders; its JSON result or the error."""
    sys.path.insert(0, str(HERE))
    from run import child_env

    with tempfile.TemporaryDirectory(prefix="ember-depth-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", config, str(depth), str(out)]
        cmd += ["--model", args.model, "--mode", args.mode, "--threads", str(args.threads)]
        proc = subprocess.run(
            cmd, env=child_env(Path(tmp) / "cache", args.threads), capture_output=True,
            text=True, timeout=args.timeout, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
            return {"error": lines[-1]}
        result: dict[str, Any] = json.loads(out.read_text())
    return result


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration at every depth, ``--repeats`` times interleaved: every process's
    result, and the run's settings."""
    configs, depths = args.configs.split(","), [int(d) for d in args.depths.split(",")]
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {c: {d: [] for d in depths} for c in configs}
    for r in range(args.repeats):
        for depth in depths:
            for config in configs:
                res = run_one(args, config, depth)
                runs[config][depth].append(res)
                cold = (
                    f"{res['cold_cpu_s']:6.2f} s CPU, {res['cold_s']:6.2f} s wall"
                    if "cold_s" in res
                    else res["error"]
                )
                log(f"  [{r + 1}/{args.repeats}] {config:<13} depth {depth:>2}: {cold}")
    loadavg = Path("/proc/loadavg").read_text().split()[:3]
    meta = {**vars(args), "loadavg_after": loadavg, "cores": os.cpu_count()}
    return {"meta": meta, "runs": runs}


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several sweeps' processes as one sweep (their runs pooled per configuration and
    depth; the first one's settings)."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for result in results:
        for config, by_depth in result["runs"].items():
            for depth, procs in by_depth.items():
                runs.setdefault(config, {}).setdefault(int(depth), []).extend(procs)
    return {"meta": dict(results[0]["meta"]), "runs": runs}


def best(result: dict[str, Any], key: str) -> dict[str, dict[int, float]]:
    """The least ``key`` (``cold_cpu_s`` or ``cold_s``) over each point's processes: the
    noise of a shared machine only ever adds."""
    out: dict[str, dict[int, float]] = {}
    for config, by_depth in result["runs"].items():
        out[config] = {}
        for depth, procs in by_depth.items():
            values = [p[key] for p in procs if key in p]
            if values:
                out[config][int(depth)] = min(values)
    return out


def slopes(points: dict[str, dict[int, float]]) -> dict[str, float | None]:
    """Each configuration's seconds per added layer: the least-squares line's slope."""
    return {
        config: fit(sorted(by_depth.items()))[0] if len(by_depth) > 1 else None
        for config, by_depth in points.items()
    }


def markdown(result: dict[str, Any]) -> str:
    """The sweep as a table (cold CPU s and wall s per depth), the slopes and their ratios."""
    cpu, wall = best(result, "cold_cpu_s"), best(result, "cold_s")
    configs = list(result["runs"])
    depths = sorted({d for c in configs for d in cpu[c]})
    meta = result["meta"]
    procs = ", ".join(f"{c} {min(len(v) for v in result['runs'][c].values())}" for c in configs)
    lines = [
        f"cold compile over depth: hf-{meta['model']} {meta['mode']}, {meta['threads']} thread(s);"
        f" CPU s (wall s), the least of each point's processes ({procs})",
        "",
        "| depth | " + " | ".join(configs) + " |",
        "|---:|" + "---:|" * len(configs),
    ]

    def cell(c: str, d: int) -> str:
        return f"{cpu[c][d]:.2f} ({wall[c][d]:.2f})" if d in cpu[c] else "error"

    for d in depths:
        lines.append(f"| {d} | " + " | ".join(cell(c, d) for c in configs) + " |")
    per_cpu, per_wall = slopes(cpu), slopes(wall)

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    row = " | ".join(f"{s(per_cpu[c])} ({s(per_wall[c])})" for c in configs)
    lines += [f"| s/layer | {row} |", ""]
    mine = per_cpu.get("ember")
    for other in ("torch", "torch-nested"):
        theirs = per_cpu.get(other)
        if mine is not None and theirs:
            lines.append(
                f"slope ratio ember / {other}: {mine / theirs:.3f} (CPU; target <= 0.1 against"
                " torch)"
            )
    for config in configs:
        if config.startswith("ember"):
            lines += phase_table(result, config)
    return "\n".join(lines)


def phase_table(result: dict[str, Any], config: str) -> list[str]:
    """An ember configuration's compile phases: thread CPU s per depth (the least of each
    point's processes) and per added layer."""
    by_depth = result["runs"].get(config, {})
    least: dict[str, dict[int, float]] = {}
    for depth, procs in by_depth.items():
        for proc in procs:
            for phase, took in proc.get("thread_phases", {}).items():
                row = least.setdefault(phase, {})
                row[int(depth)] = min(row.get(int(depth), took), took)
    for depth, procs in by_depth.items():
        for proc in procs:
            for kind in ("full", "full_s"):
                took = proc.get("gc", {}).get(kind)
                if took is not None:
                    row = least.setdefault(f"gc: {kind}", {})
                    row[int(depth)] = min(row.get(int(depth), took), took)
    if not least:
        return []
    depths = sorted({d for row in least.values() for d in row})
    lines = [
        "",
        f"{config}'s phases, thread CPU s of the first call (a phase inside another counts in"
        " both):",
        "",
        "| phase | " + " | ".join(map(str, depths)) + " | s/layer |",
        "|---|" + "---:|" * (len(depths) + 1),
    ]
    for phase, row in sorted(least.items(), key=lambda kv: -max(kv[1].values())):
        cells = " | ".join(f"{row[d]:.3f}" if d in row else "-" for d in depths)
        slope = fit(sorted(row.items()))[0] if len(row) > 1 else None
        lines.append(f"| {phase} | {cells} | {'-' if slope is None else f'{slope:.4f}'} |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", help="a name in models.hf.HF_MODELS")
    parser.add_argument("--depths", default="2,6,12,24", help="comma-separated layer counts")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="ember,ember-nomemo,torch,torch-nested"
    )
    parser.add_argument("--mode", default="infer", choices=("infer", "train"))
    parser.add_argument("--repeats", type=int, default=1, help="processes per point (best kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per process")
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument(
        "--load", metavar="JSON[,JSON]", help="print these results (pooled), run nothing"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("CONFIG", "DEPTH", "OUT"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        config, depth, out = args.child
        Path(out).write_text(json.dumps(child(config, args.model, int(depth), args.mode)))
        return
    if args.load:
        result = merged([json.loads(Path(f).read_text()) for f in args.load.split(",")])
    else:
        result = sweep(args)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
