"""Warm start from a portable pack: import + ``load_artifacts`` + first call, per zoo model.

    python benchmarks/bench_pack.py                        # inductor, every zoo model, 3 runs
    python benchmarks/bench_pack.py --backend aot_eager --names mlp,gpt --runs 5
    python benchmarks/bench_pack.py --importtime gpt       # -X importtime of one start

One subprocess compiles every named zoo model (``benchmarks/models``) once and saves one
pack with ``ember.compiler.save_artifacts``. Then each model starts in fresh processes
(``--runs`` rounds, the models interleaved within a round), each with an empty disk cache
of its own, as on a machine the pack was copied to. Such a process imports torch and the
program (the zoo), and only then the timed part: ``import ember.compiler``,
``load_artifacts(pack)``, and the first call (``compile(model)`` and calling it). It prints,
per model, the least wall seconds of each part over the runs and the best run's total,
the CPU seconds (below), the compile phases ``compile_times()`` recorded (none expected: a
pack's first call only loads), and which of :data:`HEAVY` the process had imported by then
(none expected). ``gc2`` is the CPU time of the full garbage collections that fell in the
best run's timed part: ``import torch`` leaves one due, which the next ~10,000 allocations
start, and ember's import is where it lands (about 0.08 s with torch's objects). ``cpu`` is
the least process CPU time of the runs, and ``net`` the least CPU time without those
collections (ember's own work: the steadiest number on a loaded machine). ``--trees`` compares
checkouts (each a repository root, each with a pack of its own) in one interleaved run.
Measuring processes run as ``benchmarks/run.py``'s do: one OpenMP thread, ``EMBER_CHECK=0``,
bytecode written and reused. ``docs/performance.md`` ("Portable packs: warm start") shows
what it found.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# modules a pack's first call must not need: tracing, symbolic shapes, lowering, codegen
HEAVY = (
    "sympy",
    "networkx",
    "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes",
    "ember.capture.translate",
    "ember.capture.tracer",
    "ember.capture.calls",
    "ember.aotgraph.trace",
    "ember.aotgraph.symbolic",
    "ember.aotgraph.api",
    "ember.aotgraph.store",
    "ember.inductor.compile",
    "ember.inductor.lowering",
    "ember.inductor.scheduler",
    "ember.inductor.codegen_cpp",
    "ember.inductor.codegen_triton",
)

# compile_times() phases that compile (a pack's first call has only "guards" and "load")
COMPILING = ("capture", "backend", "aot trace", "partition", "lowering", "scheduling",
             "codegen", "C++ build")  # fmt: skip


def build_pack(backend: str, names: list[str], path: str | Path) -> Any:
    """Compile and call each named zoo model once in this process, then pack what was
    compiled with ``ember.compiler.save_artifacts`` (returns its report). The compiled
    models stay alive until the pack is written: a pack holds the entries of live ones.
    compiler-api's pack tests build their packs with it too."""
    import torch
    from models import ZOO

    import ember.compiler

    keep = []
    for name in names:
        model, args = ZOO[name].make()
        opt = ember.compiler.compile(model, backend=backend)
        torch.manual_seed(1)
        opt(*args)
        keep.append(opt)
    return ember.compiler.save_artifacts(path)


BUILD = textwrap.dedent(
    """
    import sys
    from bench_pack import build_pack
    backend, path, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    saved = build_pack(backend, names, path)
    assert saved.entries == len(names) and not saved.left_out, saved
    """
)

START = textwrap.dedent(
    """
    import gc, json, sys, time
    import torch
    from models import ZOO
    backend, path, name, heavy = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    model, args = ZOO[name].make()  # the program's own work: not timed
    full = [0.0, 0.0]  # CPU seconds in full collections; when the running one started

    def collected(phase, info):
        if info["generation"] == 2:
            now = time.process_time()
            if phase == "start":
                full[1] = now
            else:
                full[0] += now - full[1]

    gc.callbacks.append(collected)
    c0, t0 = time.process_time(), time.perf_counter()
    import ember.compiler
    t1 = time.perf_counter()
    report = ember.compiler.load_artifacts(path)
    t2 = time.perf_counter()
    opt = ember.compiler.compile(model, backend=backend)
    torch.manual_seed(1)
    opt(*args)
    t3, c3 = time.perf_counter(), time.process_time()
    phases = ember.compiler.compile_times().phases
    print("RESULT " + json.dumps({
        "loaded": report.loaded, "import": t1 - t0, "load": t2 - t1, "first": t3 - t2,
        "total": t3 - t0, "cpu": c3 - c0, "gc2": full[0], "prebuilt": len(opt.stats.prebuilt),
        "phases": [p for p in phases if phases[p][0]],
        "heavy": [m for m in heavy if m in sys.modules],
    }))
    """
)


def environment(cache: str, tree: str) -> dict[str, str]:
    """A measuring process's environment (as ``benchmarks/run.py``'s ``child_env``), with the
    ember packages of the checkout at ``tree``."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    sources = sorted(glob.glob(os.path.join(tree, "packages", "*", "src")))
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "EMBER_CHECK": "0",
            "EMBER_CACHE_DIR": cache,
            "PYTHONPATH": os.pathsep.join([str(HERE), *sources]),
        }
    )
    return env


def python(
    code: str, argv: list[str], cache: str, tree: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *flags, "-c", code, *argv],
        env=environment(cache, tree), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{argv}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    return proc


def start(backend: str, pack: str, name: str, tree: str, *flags: str) -> tuple[dict[str, Any], str]:
    """One fresh process started from the pack: its result and its stderr."""
    cache = tempfile.mkdtemp(prefix="ember-pack-start-")
    proc = python(START, [backend, pack, name, *HEAVY], cache, tree, *flags)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), proc.stderr


def importtime(stderr: str, top: int = 25) -> str:
    """The slowest imports by cumulative time from ``-X importtime`` output, after torch."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = (p.strip() for p in line.removeprefix("import time:").split("|"))
            rows.append((int(cumulative), name))
    names = [n.strip() for _, n in rows]
    after = names.index("models") + 1 if "models" in names else 0  # the timed part
    shown = sorted(rows[after:], reverse=True)[:top]
    return "\n".join(f"{us / 1e6:8.3f} s  {name}" for us, name in shown)


def main() -> None:
    sys.path.insert(0, str(HERE))
    from models import ZOO

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--names", default=",".join(ZOO), help="comma-separated zoo models")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per model")
    parser.add_argument("--pack", default="", help="use this pack (default: build one)")
    parser.add_argument("--importtime", default="", help="print -X importtime of one model")
    parser.add_argument("--trees", default=str(HERE.parent), help="comma-separated checkouts")
    args = parser.parse_args()
    names, trees = args.names.split(","), args.trees.split(",")
    packs = {}
    for tree in trees:
        packs[tree] = args.pack
        if not args.pack:
            packs[tree] = os.path.join(tempfile.mkdtemp(prefix="ember-pack-"), "zoo.ember")
            saving = tempfile.mkdtemp(prefix="ember-pack-save-")
            python(BUILD, [args.backend, packs[tree], *names], saving, tree)
        size = os.path.getsize(packs[tree]) / 1e3
        print(f"{tree}: pack {packs[tree]} ({size:.0f} KB, {len(names)} models)")
    if args.importtime:
        _, stderr = start(
            args.backend, packs[trees[0]], args.importtime, trees[0], "-X", "importtime"
        )
        print(importtime(stderr))
        return
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(t, n): [] for t in trees for n in names}
    for _ in range(args.runs):
        for name in names:
            for tree in trees:
                runs[tree, name].append(start(args.backend, packs[tree], name, tree)[0])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{args.backend}, best of {args.runs} fresh processes, load average {' '.join(load)}")
    for tree in trees:
        print(f"\n{tree}")
        print(f"{'model':<18} {'import':>7} {'load':>7} {'first':>7} {'total':>7} {'cpu':>7} "
              f"{'net':>6} {'gc2':>6}  compiled / heavy modules")  # fmt: skip
        for name in names:
            results = runs[tree, name]
            best = min(results, key=lambda r: r["total"])
            parts = [min(r[k] for r in results) for k in ("import", "load", "first")]
            assert all(r["loaded"] and r["prebuilt"] == 1 for r in results), results
            compiled = [p for r in results for p in r["phases"] if p in COMPILING]
            found = sorted({*compiled, *(m for r in results for m in r["heavy"])})
            cpu = min(r["cpu"] for r in results)
            net = min(r["cpu"] - r["gc2"] for r in results)
            cells = " ".join(f"{v:7.3f}" for v in [*parts, best["total"], cpu])
            print(f"{name:<18} {cells} {net:6.3f} {best['gc2']:6.3f}  {', '.join(found) or '-'}")


if __name__ == "__main__":
    main()
