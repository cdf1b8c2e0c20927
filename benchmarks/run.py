"""ember's benchmark runner: every workload under every configuration, measured alike.

    python3 -m nox -s bench                       # or: python3 benchmarks/run.py
    python3 benchmarks/run.py --quick             # the smoke run (tests use it)
    python3 benchmarks/run.py --workloads gpt-train,bert-infer --configs eager,ember:eager
    python3 benchmarks/run.py --compare old.json  # run, then print the change against old.json
    python3 benchmarks/run.py --load new.json --compare old.json   # compare without running

Configurations: ``eager`` (PyTorch as is), ``ember:<backend>`` for every
backend ember has registered, and the peer ``torch:<backend>``
(``torch.compile`` with the same backend, same torch build) for the backends
torch also knows. Each workload of ``benchmarks/workloads.py`` runs under each
configuration in fresh processes (``benchmarks/measure.py``) with one
environment: the same thread count, the same glibc allocator settings, their
own empty cache folders. A *cold* process compiles with empty caches; a *warm*
process reuses them. Results are checked against eager's, timed, and written
as a markdown table and a JSON file (``--out``, default ``bench-results/``).
A workload that crashes or computes the wrong answer is reported as such.
``docs/performance.md`` says what each column means.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import report
import torch
from workloads import QUICK, WORKLOADS

HERE = Path(__file__).resolve().parent
MEASURE = HERE / "measure.py"
# glibc hands blocks over 128 KiB back to the OS on every free by default: about 1000
# page faults per call on the pointwise workload, eager times varying 3x between
# processes. Every configuration runs with these instead (as in noxfile's _BENCH_ENV).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
# Backend names torch.compile knows: an ember backend of one of these names has a peer.
TORCH_PEERS = ("eager", "aot_eager", "inductor")
# (rtol, atol) against eager: inference outputs; training losses, gradients and parameters
# (parameters after Adam steps with atol raised to Prepared.drift).
TOLERANCES = {"infer": (1e-4, 1e-5), "train": (1e-3, 1e-4), "step": (1e-3, 1e-4)}
# Steady-state medians of two processes of one configuration further apart than this
# (relative) make the runner start another process, up to --retries times.
PROC_SPREAD_OK = 0.10
EMBER_DISTRIBUTIONS = ("ember-guards", "ember-capture", "ember-aotgraph", "ember-inductor")


def default_configs(quick: bool = False) -> list[str]:
    """``eager``, ``ember:<b>`` for each registered backend, ``torch:<b>`` for each peer
    (only ``torch:eager`` in a quick run: torch's compiling backends take many seconds)."""
    import ember.compiler

    backends = ember.compiler.list_backends()
    peers = ("eager",) if quick else TORCH_PEERS
    return ["eager", *(f"ember:{b}" for b in backends)] + [
        f"torch:{b}" for b in backends if b in peers
    ]


def child_env(cache: Path, threads: int) -> dict[str, str]:
    """The environment of every measuring process; only the cache folders differ."""
    env = dict(os.environ, **MALLOC_ENV)
    # Bytecode is written and reused, as for an installed package (pip compiles it): else a
    # lazily imported module of ember's would be compiled from source inside its timings.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "PYTHONHASHSEED": "0",
            "EMBER_CHECK": "0",  # the test suite's IR checkers are not part of a measurement
            "EMBER_CACHE_DIR": str(cache / "ember"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
        }
    )
    return env


def run_child(
    args: argparse.Namespace, workload: str, config: str, phase: str, work: Path
) -> dict[str, Any]:
    """Run ``measure.py`` once; its JSON result, or ``status`` crash/timeout with the error."""
    prefix = work / f"{workload}.{config.replace(':', '-')}.{phase}"
    cmd = [sys.executable, str(MEASURE), workload, config, phase.split("#")[0], str(prefix)]
    cmd += ["--threads", str(args.threads), *(["--quick"] if args.quick else [])]
    cache = work / "cache" / f"{workload}.{config.replace(':', '-')}"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=child_env(cache, args.threads), capture_output=True, text=True,
            timeout=args.timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"{phase}: no result after {args.timeout} s"}
    seconds = time.perf_counter() - start
    log(f"  {workload:<20} {config:<14} {phase:<6} {seconds:5.1f} s  rc={proc.returncode}")
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"status": "crash", "error": f"{phase}: {lines[-1]}", "stderr": proc.stderr[-4000:]}
    result: dict[str, Any] = json.loads(Path(f"{prefix}.json").read_text())
    return {**result, "status": "ok", "process_s": seconds, "tensors": f"{prefix}.pt"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def check(mode: str, reference: dict[str, Any] | None, mine: dict[str, Any]) -> dict[str, Any]:
    """Compare the saved results of a configuration with eager's: status and largest error."""
    if mine.get("status") != "ok":
        return {"status": mine["status"], "error": mine.get("error")}
    if reference is None or reference.get("status") != "ok":
        return {"status": "no reference", "error": "eager did not run"}
    want = torch.load(reference["tensors"], weights_only=False)
    got = torch.load(mine["tensors"], weights_only=False)
    rtol, tol = TOLERANCES[mode]
    worst, message = 0.0, None
    for name, a, b in pairs(got, want):
        # parameters after Adam steps may drift by up to lr a step (Prepared.drift); their
        # gradients, compared as well, are what shows a wrong backward
        atol = max(tol, want.get("drift", 0.0)) if name.startswith("['state']") else tol
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            message = message or (None if a == b else f"{name}: {a!r} != {b!r}")
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            message = message or f"{name}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}"
            continue
        diff = (a.double() - b.double()).abs().nan_to_num(0.0, posinf=0.0)
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True):
            message = message or f"{name}: max abs error {float(diff.max()):.3g}"
    return {"status": "wrong" if message else "ok", "error": message, "max_error": worst}


def pairs(got: Any, want: Any, name: str = "") -> list[tuple[str, Any, Any]]:
    """Leaves of two nested results side by side, named by their path (``results[0]``)."""
    table: dict[type, Callable[[Any], list[Any]]] = {
        dict: lambda x: list(x.items()),
        list: lambda x: list(enumerate(x)),
    }
    table[tuple] = table[list]
    # isinstance, not type: a transformers ModelOutput is a dict (of its non-None fields)
    flatten = next((f for kind, f in table.items() if isinstance(want, kind)), None)
    if flatten is None or type(got) is not type(want) or len(got) != len(want):
        return [(name or "result", got, want)]
    mine = dict(flatten(got))
    out = []
    for key, value in flatten(want):
        if key not in mine:
            return [(f"{name}[{key!r}]", None, value)]
        out += pairs(mine[key], value, f"{name}[{key!r}]")
    return out


def compile_seconds(proc: dict[str, Any] | None, wall_s: float | None) -> float | None:
    """First call minus one steady-state call: the time spent importing the compiler,
    capturing and compiling (``measure.first_call``)."""
    if not proc or proc.get("status") != "ok" or wall_s is None:
        return None
    return max(0.0, float(proc["first_call_s"]) - wall_s)


def _median(values: list[float | None]) -> float | None:
    """The median of the values there are (warm compile: every process after the cold one
    starts with the caches kept, so each is a sample), None if none."""
    present = sorted(v for v in values if v is not None)
    return statistics.median(present) if present else None


def scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def summarize(
    workload: str, config: str, procs: list[dict[str, Any]], verdict: dict[str, Any]
) -> dict[str, Any]:
    """One row of the report from a configuration's processes (cold, warm, repeats)."""
    cold, warm = procs[0], (procs[1] if len(procs) > 1 else None)
    timed = [p for p in procs if p.get("status") == "ok"]
    best = min(timed, key=lambda p: (p["noisy"], p["timing"]["median_s"])) if timed else None
    medians = [p["timing"]["median_s"] for p in timed]
    wall = best["timing"]["wall_median_s"] if best else None
    row: dict[str, Any] = {"workload": workload, "config": config, **verdict}
    row |= {
        "cold_s": compile_seconds(cold, wall),
        "warm_s": _median([compile_seconds(p, wall) for p in procs[1:]]),
        "import_s": _median([p.get("import_s") for p in procs if p.get("status") == "ok"]),
        "first_call_s": [p.get("first_call_s") for p in procs],
        "median_ms": best["timing"]["median_s"] * 1e3 if best else None,
        "wall_median_ms": wall * 1e3 if wall else None,
        "clock": best["timing"]["clock"] if best else None,
        "spread": best["timing"]["spread"] if best else None,
        "proc_spread": max(medians) / min(medians) - 1 if len(medians) > 1 else None,
        "noisy": best["noisy"] if best else None,
        "load": max(p["timing"]["load"] for p in timed) if timed else None,
        "drift": best["timing"]["drift"] if best else None,
        "calibration_ms": best["timing"]["calibration_s"][0] * 1e3 if best else None,
        "processes": len(procs),
        "overhead_us": scaled((warm or {}).get("overhead_s"), 1e6),
        "peak_mib": cold.get("peak_mib"),
    }
    source = cold if cold.get("status") == "ok" else (warm or {})
    for key in ("graphs", "breaks", "graph_breaks", "eager_frames", "ops"):
        row[key] = source.get(key)
    row["notes"] = source.get("notes", [])
    return row


def verdict(
    mode: str, procs: list[dict[str, Any]], reference: dict[str, Any] | None
) -> dict[str, Any]:
    """Correctness of the cold process's results; a crash in any process overrides it."""
    failed = [p for p in procs if p.get("status") != "ok"]
    if failed:
        return {key: failed[0].get(key) for key in ("status", "error", "stderr")}
    return check(mode, reference, procs[0])


def needs_repeat(procs: list[dict[str, Any]]) -> bool:
    """Whether a configuration's timings are too noisy to report without another process."""
    timed = [p for p in procs if p.get("status") == "ok"]
    if not timed or len(timed) < len(procs):
        return False
    medians = [p["timing"]["median_s"] for p in timed]
    apart = max(medians) / min(medians) - 1 > PROC_SPREAD_OK
    return apart or all(p["noisy"] for p in timed)


def run_workload(
    args: argparse.Namespace, name: str, configs: list[str], work: Path
) -> list[dict[str, Any]]:
    """All configurations of one workload: cold processes, then warm ones, then repeats."""
    procs = {c: [run_child(args, name, c, "cold", work)] for c in configs}
    for c in configs:
        if procs[c][0]["status"] == "ok" and not (args.quick and c == "eager"):
            procs[c].append(run_child(args, name, c, "warm", work))
    for i in range(args.retries):  # every configuration again, so each has as many tries
        if not any(needs_repeat(procs[c]) for c in configs):
            break
        for c in configs:
            if all(p["status"] == "ok" for p in procs[c]):
                procs[c].append(run_child(args, name, c, f"warm#{i + 2}", work))
    mode = WORKLOADS[name].mode
    reference = procs["eager"][0] if "eager" in procs else None
    rows = [summarize(name, c, procs[c], verdict(mode, procs[c], reference)) for c in configs]
    base = rows[configs.index("eager")]["median_ms"] if "eager" in configs else None
    for row in rows:
        row["mode"] = mode
        row["ratio"] = row["median_ms"] / base if base and row["median_ms"] else None
    return rows


def git_revision() -> str:
    """The checkout's commit, with ``+dirty`` if files differ from it."""

    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=HERE, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def metadata(args: argparse.Namespace, configs: list[str], seconds: float) -> dict[str, Any]:
    """What a reader needs to trust a table: when, which versions, which machine, which settings."""
    versions = {}
    for dist in (*EMBER_DISTRIBUTIONS, "ember-compiler-api"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "ember": versions,
        "git": git_revision(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "os": platform.platform()},
        "threads": args.threads,
        "env": MALLOC_ENV,
        "quick": args.quick,
        "configs": configs,
        "wall_s": seconds,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected workload under every configuration; the results with their metadata."""
    configs = args.configs.split(",") if args.configs else default_configs(args.quick)
    names = args.workloads.split(",") if args.workloads else (QUICK if args.quick else WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    start = time.perf_counter()
    rows, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp:
        for name in names:
            reason = WORKLOADS[name].family.missing()
            if reason:
                log(f"{name}: skipped: {reason}")
                skipped[name] = reason
                continue
            log(f"{name}:")
            rows += run_workload(args, name, configs, Path(tmp))
    meta = metadata(args, configs, time.perf_counter() - start)
    meta["noise"], meta["skipped"] = noise(rows), skipped
    return {"meta": meta, "results": rows}


def noise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How disturbed the run was: spreads, other load and the calibration loop over all rows."""

    def stats(key: str) -> list[float] | None:
        values = sorted(r[key] for r in rows if r.get(key) is not None)
        return [values[0], values[len(values) // 2], values[-1]] if values else None

    keys = ("spread", "proc_spread", "load", "calibration_ms")
    return {
        "min/median/max": {k: stats(k) for k in keys},
        "processes": sum(r["processes"] for r in rows),
        "noisy rows": sum(bool(r.get("noisy")) for r in rows),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 2 workloads")
    parser.add_argument("--workloads", help="comma-separated names (default: all)")
    parser.add_argument("--configs", help="comma-separated, e.g. eager,ember:eager,torch:eager")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--retries", type=int, help="extra processes if noisy (2; quick 0)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per process")
    parser.add_argument("--out", default="bench-results", help="folder for results.json/.md")
    parser.add_argument("--load", metavar="JSON", help="report this results file, run nothing")
    parser.add_argument("--compare", metavar="OLD_JSON", help="print the change against OLD_JSON")
    args = parser.parse_args(argv)
    if args.retries is None:
        args.retries = 0 if args.quick else 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.load:
        results = json.loads(Path(args.load).read_text())
    else:
        results = run_all(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "results.md").write_text(report.markdown(results))
        log(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    print(report.markdown(results))
    if args.compare:
        print(report.compare(json.loads(Path(args.compare).read_text()), results))


if __name__ == "__main__":
    main()
