"""ember.inductor's Triton printer on a CUDA GPU: correctness against eager, steady speed
and cold compile time against eager and torch.compile (inductor).

Runs without ember's capture (Python 3.11 only) and without installing anything: graphs
come from ``make_fx``, go through ``ember.inductor.compile_graph`` (which decomposes them
itself) and run on CUDA tensors. From the repository root:

    PYTHONPATH=packages/aotgraph/src:packages/inductor/src python benchmarks/gpu_check.py

Prints the versions, one line per graph while it runs, and a markdown table. Exits 1 if a
compiled graph gives a wrong answer, 2 if ember does not import here (with the reason).
Each cold compile runs with fresh TRITON_CACHE_DIR, EMBER_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR folders. ``--quick`` runs fewer timing iterations;
``--compile-only`` checks correctness and times cold and warm compiles only (with
``--reduce-overhead``, also the second table).

A second table times ``reduce-overhead`` on small graphs, where kernel launches are the
cost: wall time per call (a loop of calls, then one synchronisation) for eager, ember's
kernels, ember's kernels replayed from a CUDA graph (``ember.aotgraph.cudagraphs``), and
``torch.compile(mode="reduce-overhead")``. ember's column has no capture or guard layer
here (capture needs Python 3.11), torch's has dynamo's guards: ember's number is its
graph's per-call cost, not a whole compiled call's.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

T = torch.Tensor
ITERS = 10 if "--quick" in sys.argv else 50
COMPILE_ONLY = "--compile-only" in sys.argv  # correctness, cold and warm compile; no timing


def versions() -> None:
    try:
        import triton

        version = triton.__version__
    except ImportError:
        version = "not installed"
    print(f"python {platform.python_version()}, torch {torch.__version__}", end=", ")
    print(f"triton {version}")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})")


def import_ember() -> Any:
    """ember.inductor's compile_graph, or exit 2 with why it does not import here."""
    try:
        import ember.aotgraph  # noqa: F401
        from ember.inductor import compile_graph
    except Exception:
        traceback.print_exc()
        print("FAIL: ember.aotgraph / ember.inductor do not import with this Python and torch")
        sys.exit(2)
    return compile_graph


# ---- graphs -------------------------------------------------------------------------------


def pointwise(x: T, y: T) -> T:
    return ((x * 2 + y).relu().exp() - y.abs()).sigmoid()


def softmax(x: T) -> T:
    return torch.softmax(x, -1)


def layer_norm(x: T, w: T, b: T) -> T:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def mlp(x: T, w1: T, b1: T, w2: T, b2: T) -> T:
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def column_sums(x: T) -> tuple[T, T]:
    return x.sum(0), x.amax(0)


def softmax_half(x: T) -> T:
    return torch.softmax(x, -1)


def cases() -> list[tuple[str, Callable[..., Any], list[T], float]]:
    """(name, function, CUDA inputs, tolerance)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> T:
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    mlp_inputs = [r(512, 1024), r(4096, 1024) * 0.03, r(4096), r(1024, 4096) * 0.03, r(1024)]
    return [
        ("pointwise 4096x4096", pointwise, [r(4096, 4096), r(4096, 4096)], 1e-5),
        ("softmax 4096x1024", softmax, [r(4096, 1024)], 1e-5),
        ("softmax 256x32768 (looped)", softmax, [r(256, 32768)], 1e-5),
        ("layer_norm 4096x1024", layer_norm, [r(4096, 1024), r(1024), r(1024)], 1e-4),
        ("mlp 512x1024x4096", mlp, mlp_inputs, 1e-3),
        ("sum+amax over dim 0 4096x1024", column_sums, [r(4096, 1024)], 1e-3),
        ("softmax fp16 4096x1024", softmax_half, [r(4096, 1024, dtype=torch.float16)], 2e-3),
    ]


def block(x: T, ln_w: T, ln_b: T, qkv_w: T, proj_w: T, fc_w: T, out_w: T) -> T:
    """A small pre-norm transformer block: 4 heads, attention through SDPA."""
    b, n, d = x.shape
    h = F.layer_norm(x, (d,), ln_w, ln_b)
    q, k, v = F.linear(h, qkv_w).view(b, n, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(a.transpose(1, 2).reshape(b, n, d), proj_w)
    h = F.layer_norm(x, (d,), ln_w, ln_b)
    return x + F.linear(F.gelu(F.linear(h, fc_w)), out_w)


def small_cases() -> list[tuple[str, Callable[..., Any], list[T]]]:
    """Graphs small enough that launching their kernels is most of their time."""
    g = torch.Generator(device="cuda").manual_seed(1)

    def r(*shape: int) -> T:
        return torch.randn(*shape, device="cuda", generator=g) * 0.05

    d = 256
    return [
        ("pointwise 1024", pointwise, [r(1024), r(1024)]),
        ("mlp 8x256x1024", mlp, [r(8, d), r(4 * d, d), r(4 * d), r(d, 4 * d), r(d)]),
        ("softmax 32x512", softmax, [r(32, 512)]),
        ("block 1x64x256", block,
         [r(1, 64, d), r(d) + 1, r(d), r(3 * d, d), r(d, d), r(4 * d, d), r(d, 4 * d)]),
    ]  # fmt: skip


def per_call(fn: Callable[[], Any], calls: int = 20 * ITERS) -> float:
    """Milliseconds of wall time per call of a loop of calls (launch overhead included)."""
    wait_for_builds()
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best


def host_per_call(fn: Callable[[], Any], calls: int = 100) -> float:
    """Milliseconds of host time per call, the device left to catch up afterwards: the
    launch side's cost alone (a graph replay's Python layer, or the kernel launches)."""
    wait_for_builds()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e3
    torch.cuda.synchronize()
    return host


def reduce_overhead(compile_graph: Any) -> tuple[list[dict[str, Any]], bool]:
    """The reduce-overhead table's rows, and whether a replayed graph gave a wrong answer."""
    from ember.aotgraph.cudagraphs import cudagraphify

    rows, wrong = [], False
    for name, fn, inputs in small_cases():
        gm = make_fx(fn)(*inputs)
        kernels = compile_graph(gm, inputs, {"graph_cache": False})
        replayed = cudagraphify(kernels)
        want = fn(*inputs)
        for _ in range(3):  # warm-up, record, replay
            got = replayed(*inputs)
        ok = max_error(got, want) <= 1e-3 and replayed.replays == 2 and not replayed.fallback
        wrong |= not ok
        row = {"graph": name, "ok": ok, "fallback": replayed.fallback or "-"}
        row["eager ms"] = per_call(functools.partial(fn, *inputs))
        row["ember ms"] = per_call(functools.partial(kernels, *inputs))
        row["ember graph ms"] = per_call(functools.partial(replayed, *inputs))
        row["ember host ms"] = host_per_call(functools.partial(replayed, *inputs))
        try:
            torch._dynamo.reset()
            tc = torch.compile(fn, mode="reduce-overhead")
            row["torch graph ms"] = per_call(functools.partial(tc, *inputs))
            row["torch host ms"] = host_per_call(functools.partial(tc, *inputs))
        except Exception as e:
            row["torch graph ms"] = float("nan")
            print(f"  torch.compile failed on {name}: {e!r}")
        rows.append(row)
        print(f"{name}: {'PASS' if ok else 'FAIL'} {row}", flush=True)
    return rows, wrong


def markdown(
    rows: list[dict[str, Any]], cols: list[str], number: str, per_col: dict[str, str] | None = None
) -> list[str]:
    """The lines of a markdown table of ``rows``: booleans as PASS/FAIL, floats formatted with
    ``number`` (or ``per_col[col]``), missing cells empty."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [
            ("PASS" if v else "FAIL") if isinstance(v, bool) else
            (per_col or {}).get(c, number).format(v) if isinstance(v, float) else str(v)
            for c, v in ((c, row.get(c, "")) for c in cols)
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ro_table(rows: list[dict[str, Any]]) -> str:
    cols = ["graph", "ok", "fallback", "eager ms", "ember ms", "ember graph ms", "torch graph ms",
            "ember host ms", "torch host ms"]  # fmt: skip
    lines = markdown(rows, cols, "{:.4f}")
    ratio = _geomean([r["ember graph ms"] / r["torch graph ms"] for r in rows])
    lines.append(f"\ngeomean per-call time ember graph / torch reduce-overhead: {ratio:.2f}x")
    return "\n".join(lines)


# ---- measuring ----------------------------------------------------------------------------


def steady(fn: Callable[[], Any]) -> float:
    """Median milliseconds of one call, after warm-up (CUDA events around each call), once
    every kernel has been built (ember's background builds)."""
    wait_for_builds()
    for _ in range(3):
        fn()
    times = []
    for _ in range(ITERS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


CACHES = ("TRITON_CACHE_DIR", "EMBER_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def fresh_caches() -> dict[str, str]:
    """New empty cache folders in the environment; returns them."""
    for var in CACHES:
        os.environ[var] = tempfile.mkdtemp(prefix=var.lower() + "_")
    return {var: os.environ[var] for var in CACHES}


def cold(build: Callable[[], Callable[[], Any]]) -> tuple[Callable[[], Any], float]:
    """The callable ``build`` makes, and seconds to make it and finish its first call."""
    fresh_caches()
    return timed_first_call(build)


def wait_for_builds() -> None:
    """Wait for ember's kernels still building in the background (none where it is off)."""
    from ember.inductor.cache import wait_for_builds as wait

    wait()


def built() -> float:
    """Seconds until every kernel building in the background is built and the device idle:
    the wait between a first call answered with aten calls and the kernels taking over."""
    start = time.perf_counter()
    wait_for_builds()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def timed_first_call(build: Callable[[], Callable[[], Any]]) -> tuple[Callable[[], Any], float]:
    start = time.perf_counter()
    call = build()
    call()
    torch.cuda.synchronize()
    return call, time.perf_counter() - start


def _leaves(out: Any) -> list[T]:
    return list(out) if isinstance(out, tuple | list) else [out]


def max_error(got: Any, want: Any) -> float:
    pairs = zip(_leaves(got), _leaves(want), strict=True)
    return max((g.float() - w.float()).abs().max().item() for g, w in pairs)


def check_one(
    compile_graph: Any, name: str, fn: Callable[..., Any], inputs: list[T], tol: float
) -> dict[str, Any]:
    row: dict[str, Any] = {"graph": name}
    gm = make_fx(fn)(*inputs)
    ember, row["ember cold s"] = cold(lambda: _ember(compile_graph, gm, inputs))
    row["ember ready s"] = row["ember cold s"] + built()
    row["ember caches"] = {var: os.environ[var] for var in CACHES}  # for the warm compile
    # evidence that the cold compile filled the fresh Triton cache (kernels were built)
    row["triton cache files"] = sum(len(f) for _, _, f in os.walk(os.environ["TRITON_CACHE_DIR"]))
    compiled = ember.func  # type: ignore[attr-defined]
    target = getattr(compiled, "target", None)
    row["printer"] = target.printer if target is not None else "eager (fell back)"
    want = fn(*inputs)
    wait_for_builds()  # the kernels' numbers, not the aten calls' of a first call
    err = max_error(ember(), want)
    scale = max(w.float().abs().max().item() for w in _leaves(want))
    row["max abs err"] = err
    row["ok"] = err <= tol * max(1.0, scale)
    if not COMPILE_ONLY:
        row["eager ms"] = steady(lambda: fn(*inputs))
        row["ember ms"] = steady(ember)
    try:
        torch._dynamo.reset()
        tc, row["torch cold s"] = cold(lambda: _torch_compiled(fn, inputs))
        row["torch caches"] = {var: os.environ[var] for var in CACHES}
        if not COMPILE_ONLY:
            row["torch ms"] = steady(tc)
    except Exception as e:  # torch.compile's problem, not ember's: reported, not fatal
        row["torch cold s"], row["torch ms"] = float("nan"), float("nan")
        print(f"  torch.compile failed on {name}: {e!r}")
    return row


def _ember(
    compile_graph: Any, gm: torch.fx.GraphModule, inputs: list[T], options: Any = None
) -> Callable[[], Any]:
    compiled = compile_graph(gm, inputs, options)  # None: the defaults, graph cache on
    return functools.partial(compiled, *inputs)


def _torch_compiled(fn: Callable[..., Any], inputs: list[T]) -> Callable[[], Any]:
    return functools.partial(torch.compile(fn, backend="inductor"), *inputs)


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["graph", "printer", "max abs err", "ok", "eager ms", "ember ms", "torch ms",
            "ember cold s", "ember ready s", "torch cold s", "ember warm s",
            "torch warm s"]  # fmt: skip
    lines = markdown(rows, cols, "{:.3f}", {"max abs err": "{:.3g}"})
    geo = _geomean(
        [r["torch ms"] / r["ember ms"] for r in rows if r.get("ember ms") and r.get("torch ms")]
    )
    lines.append(f"\ngeomean speed ember vs torch.compile: {geo:.2f}x (>1: ember faster)")
    pairs = [("ember cold s", "torch cold s"), ("ember ready s", "torch cold s"),
             ("ember warm s", "torch warm s")]  # fmt: skip
    for ember_col, torch_col in pairs:
        ratio = _geomean([r[ember_col] / r[torch_col] for r in rows
                          if r.get(ember_col) and r.get(torch_col)])  # fmt: skip
        lines.append(f"geomean {ember_col} / {torch_col}: {ratio:.2f}x")
    return "\n".join(lines)


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return float(torch.tensor(xs).log().mean().exp()) if xs else float("nan")


# ---- warm compile: a fresh process over the cache folders the cold compiles filled -------


def warm(rows: list[dict[str, Any]]) -> None:
    """Adds "ember warm s" and "torch warm s" to ``rows``: compile and first call in a new
    process per graph, started with the cache folders its cold compile filled (ember's graph
    and Triton caches; torch's FX graph, autotune and Triton caches), as a user's next run."""
    for row in rows:
        if "ember caches" not in row:
            continue
        item = {
            "graph": row["graph"],
            "ember": row["ember caches"],
            "torch": row.get("torch caches"),
        }
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(item, f)
        child = [sys.executable, os.path.abspath(__file__), "--warm-child", path]
        env = {**os.environ, **item["ember"]}
        out = subprocess.run(
            child, capture_output=True, text=True, timeout=300, check=False, env=env
        )
        for line in out.stdout.splitlines():
            if line.startswith("WARM "):
                row.update(json.loads(line[5:]))
        if out.returncode:
            print(
                f"warm child failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
            )


def warm_child(path: str) -> int:
    """The child of :func:`warm`: one untimed compile of another graph through each compiler
    first (module imports, CUDA context), then the graph's compile and first call through
    each, timed, each over its cold compile's cache folders."""
    with open(path) as f:
        item = json.load(f)
    compile_graph = import_ember()
    fn, inputs = next((f, i) for name, f, i, _ in cases() if name == item["graph"])
    gm = make_fx(fn)(*inputs)  # capture's stand-in, outside the timing as in the cold run
    x = torch.randn(8, 8, device="cuda")  # (the folders stay as the process started)
    compile_graph(make_fx(torch.sin)(x), [x], {"graph_cache": False})(x)
    wait_for_builds()
    found: dict[str, float] = {}
    # kernels loaded on the first call (background builds off here): the whole warm start
    sync = {"background_compile": "off"}
    build = functools.partial(_ember, compile_graph, gm, inputs, sync)
    found["ember warm s"] = timed_first_call(build)[1]
    if item["torch"]:
        # torch's untimed compile only now: after it, ember's warm start measured 0.09-0.20 s
        # against 0.017 s without it (H200; the start-up of torch's pool of compile workers
        # is the likely cause, not confirmed)
        os.environ.update(item["torch"])
        torch.compile(torch.cos)(x)
        torch._dynamo.reset()
        found["torch warm s"] = timed_first_call(functools.partial(_torch_compiled, fn, inputs))[1]
    print("WARM " + json.dumps(found), flush=True)
    return 0


# ---- max-autotune: block sizes, warps, and the matmul template against the extern --------

AUTOTUNED = ("pointwise 4096x4096", "softmax 4096x1024", "layer_norm 4096x1024",
             "mlp 512x1024x4096", "softmax 256x32768 (looped)")  # fmt: skip


def autotune_rows(compile_graph: Any, torch_ms: dict[str, float]) -> list[dict[str, Any]]:
    """ember's default graph against its ``max_autotune`` choice (timed on this GPU); for the
    MLP also the Triton matmul template forced, against aten's extern matmul."""
    from ember.inductor.knobs import Knobs, knobs

    rows = []
    for name, fn, inputs, tol in cases():
        if name not in AUTOTUNED:
            continue
        row: dict[str, Any] = {"graph": name}
        gm = make_fx(fn)(*inputs)
        want = fn(*inputs)
        scale = max(1.0, *(w.float().abs().max().item() for w in _leaves(want)))
        fresh_caches()
        options = {"graph_cache": False, "max_autotune": True}
        build = functools.partial(_ember, compile_graph, gm, inputs, options)
        tuned, row["autotune s"] = timed_first_call(build)
        wait_for_builds()  # (the kernels' numbers, not a first call's aten calls)
        row["ok"] = max_error(tuned(), want) <= tol * scale
        row["kept"] = "template" if "tl.dot(" in tuned.func.source else "-"
        default = compile_graph(gm, inputs, {"graph_cache": False})
        row["default ms"] = steady(functools.partial(default, *inputs))
        row["tuned ms"] = steady(tuned)
        if name.startswith("mlp"):
            with knobs(Knobs(matmul="template")):
                template = compile_graph(gm, inputs, {"graph_cache": False})
            template(*inputs)
            wait_for_builds()
            row["ok"] &= max_error(template(*inputs), want) <= tol * scale
            row["template ms"] = steady(functools.partial(template, *inputs))
        row["torch ms"] = torch_ms.get(name, float("nan"))
        rows.append(row)
        print(f"autotune {name}: {'PASS' if row['ok'] else 'FAIL'} {row}", flush=True)
    return rows


def autotune_table(rows: list[dict[str, Any]]) -> str:
    cols = ["graph", "ok", "kept", "default ms", "tuned ms", "template ms", "torch ms",
            "autotune s"]  # fmt: skip
    lines = markdown(rows, cols, "{:.3f}")
    ratio = _geomean([r["torch ms"] / r["tuned ms"] for r in rows])
    lines.append(f"\ngeomean speed ember max-autotune vs torch.compile default: {ratio:.2f}x")
    return "\n".join(lines)


# ---- where a cold compile's time goes ----------------------------------------------------


def profile_cold(compile_graph: Any) -> None:
    """cProfile of a cold compile and first call (fresh cache folders), then of a warm one
    (the same folders), each in a fresh process after one untimed compile of another graph:
    which of lowering, code generation, Triton's compiler, its launcher build and ptxas the
    seconds go to."""
    fresh_caches()
    for kind in ("cold", "warm"):
        child = [sys.executable, os.path.abspath(__file__), "--profile-child", kind]
        out = subprocess.run(
            child, capture_output=True, text=True, timeout=300, check=False, env=os.environ
        )
        print(out.stdout[-12000:], out.stderr[-3000:] if out.returncode else "")


def profile_child(kind: str) -> int:
    import cProfile
    import pstats

    compile_graph = import_ember()
    caches = {var: os.environ[var] for var in CACHES}
    x = torch.randn(8, 8, device="cuda")
    fresh_caches()  # the untimed compile: imports, CUDA context, Triton's start-up
    compile_graph(make_fx(torch.sin)(x), [x], {"graph_cache": False})(x)
    wait_for_builds()
    os.environ.update(caches)
    name, fn, inputs, _ = cases()[1]
    gm = make_fx(fn)(*inputs)
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    compiled = compile_graph(gm, inputs, {"background_compile": "off"})  # (profiled here)
    compiled(*inputs)
    torch.cuda.synchronize()
    prof.disable()
    print(f"== {kind} compile and first call: {name}, {time.perf_counter() - start:.3f} s")
    run = getattr(compiled, "_run", None)
    if run is not None:
        print("phases: " + ", ".join(f"{k} {v:.3f}" for k, v in run.times.items()))
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(12)
    return 0


def section(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None after printing its traceback: one part's failure leaves the
    others' numbers."""
    try:
        return fn(*args)
    except Exception:
        traceback.print_exc()
        print(f"FAIL: {fn.__name__} raised")
        return None


def main() -> int:
    versions()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    compile_graph = import_ember()
    rows, wrong = [], False
    for name, fn, inputs, tol in cases():
        try:
            row = check_one(compile_graph, name, fn, inputs, tol)
        except Exception:
            traceback.print_exc()
            row = {"graph": name, "printer": "ERROR", "ok": False}
        wrong |= not row["ok"]
        rows.append(row)
        print(f"{name}: {'PASS' if row['ok'] else 'FAIL'} {row}", flush=True)
    section(warm, rows)
    print()
    print(table(rows))
    if COMPILE_ONLY and "--reduce-overhead" not in sys.argv:
        return 1 if wrong else 0
    ro = section(reduce_overhead, compile_graph)
    if ro is not None:
        print()
        print(ro_table(ro[0]))
    wrong |= ro is None or ro[1]
    if COMPILE_ONLY:
        return 1 if wrong else 0
    torch_ms = {r["graph"]: r.get("torch ms", float("nan")) for r in rows}
    at_rows = section(autotune_rows, compile_graph, torch_ms)
    if at_rows is not None:
        print()
        print(autotune_table(at_rows))
    wrong |= at_rows is None or not all(r["ok"] for r in at_rows)
    if "--profile" in sys.argv:
        section(profile_cold, compile_graph)
    return 1 if wrong else 0


if __name__ == "__main__":
    if "--profile-child" in sys.argv:
        sys.exit(profile_child(sys.argv[sys.argv.index("--profile-child") + 1]))
    if "--warm-child" in sys.argv:
        sys.exit(warm_child(sys.argv[sys.argv.index("--warm-child") + 1]))
    sys.exit(main())
