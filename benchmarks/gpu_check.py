"""ember.inductor's Triton printer on a CUDA GPU: correctness against eager, steady speed
and cold compile time against eager and torch.compile (inductor).

Runs without ember's capture (Python 3.11 only) and without installing anything: graphs
come from ``make_fx``, go through ``ember.inductor.compile_graph`` (which decomposes them
itself) and run on CUDA tensors. From the repository root:

    PYTHONPATH=packages/aotgraph/src:packages/inductor/src python benchmarks/gpu_check.py

Prints the versions, one line per graph while it runs, and a markdown table. Exits 1 if a
compiled graph gives a wrong answer, 2 if ember does not import here (with the reason).
Each cold compile runs with fresh TRITON_CACHE_DIR, EMBER_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR folders. ``--quick`` runs fewer timing iterations.

A second table times ``reduce-overhead`` on small graphs, where kernel launches are the
cost: wall time per call (a loop of calls, then one synchronisation) for eager, ember's
kernels, ember's kernels replayed from a CUDA graph (``ember.aotgraph.cudagraphs``), and
``torch.compile(mode="reduce-overhead")``. ember's column has no capture or guard layer
here (capture needs Python 3.11), torch's has dynamo's guards: ember's number is its
graph's per-call cost, not a whole compiled call's.
"""

from __future__ import annotations

import os
import platform
import statistics
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


def versions() -> None:
    import triton

    print(f"python {platform.python_version()}, torch {torch.__version__}", end=", ")
    print(f"triton {triton.__version__}")
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
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e3
    torch.cuda.synchronize()
    return host


def reduce_overhead(compile_graph: Any) -> tuple[list[dict[str, Any]], bool]:
    """The reduce-overhead table's rows, and whether a replayed graph gave a wrong answer."""
    import functools

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


def ro_table(rows: list[dict[str, Any]]) -> str:
    cols = ["graph", "ok", "fallback", "eager ms", "ember ms", "ember graph ms", "torch graph ms",
            "ember host ms", "torch host ms"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [
            ("PASS" if v else "FAIL") if isinstance(v, bool) else
            f"{v:.4f}" if isinstance(v, float) else str(v)
            for v in (row.get(c, "") for c in cols)
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    ratio = _geomean([r["ember graph ms"] / r["torch graph ms"] for r in rows])
    lines.append(f"\ngeomean per-call time ember graph / torch reduce-overhead: {ratio:.2f}x")
    return "\n".join(lines)


# ---- measuring ----------------------------------------------------------------------------


def steady(fn: Callable[[], Any]) -> float:
    """Median milliseconds of one call, after warm-up (CUDA events around each call)."""
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


def fresh_caches() -> None:
    for var in ("TRITON_CACHE_DIR", "EMBER_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[var] = tempfile.mkdtemp(prefix=var.lower() + "_")


def cold(build: Callable[[], Callable[[], Any]]) -> tuple[Callable[[], Any], float]:
    """The callable ``build`` makes, and seconds to make it and finish its first call."""
    fresh_caches()
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
    # evidence that the cold compile filled the fresh Triton cache (kernels were built)
    row["triton cache files"] = sum(len(f) for _, _, f in os.walk(os.environ["TRITON_CACHE_DIR"]))
    compiled = ember.func  # type: ignore[attr-defined]
    target = getattr(compiled, "target", None)
    row["printer"] = target.printer if target is not None else "eager (fell back)"
    want = fn(*inputs)
    err = max_error(ember(), want)
    scale = max(w.float().abs().max().item() for w in _leaves(want))
    row["max abs err"] = err
    row["ok"] = err <= tol * max(1.0, scale)
    row["eager ms"] = steady(lambda: fn(*inputs))
    row["ember ms"] = steady(ember)
    try:
        torch._dynamo.reset()
        tc, row["torch cold s"] = cold(lambda: _torch_compiled(fn, inputs))
        row["torch ms"] = steady(tc)
    except Exception as e:  # torch.compile's problem, not ember's: reported, not fatal
        row["torch cold s"], row["torch ms"] = float("nan"), float("nan")
        print(f"  torch.compile failed on {name}: {e!r}")
    return row


def _ember(compile_graph: Any, gm: torch.fx.GraphModule, inputs: list[T]) -> Callable[[], Any]:
    import functools

    compiled = compile_graph(gm, inputs, {"graph_cache": False})
    return functools.partial(compiled, *inputs)


def _torch_compiled(fn: Callable[..., Any], inputs: list[T]) -> Callable[[], Any]:
    import functools

    return functools.partial(torch.compile(fn, backend="inductor"), *inputs)


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["graph", "printer", "max abs err", "ok", "eager ms", "ember ms", "torch ms",
            "ember cold s", "torch cold s"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " | ", "|" + "---|" * len(cols)]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c, "")
            if isinstance(v, bool):
                v = "PASS" if v else "FAIL"
            elif isinstance(v, float):
                v = f"{v:.3g}" if "err" in c else f"{v:.3f}"
            cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    geo = _geomean([r["torch ms"] / r["ember ms"] for r in rows if r.get("ember ms")])
    lines.append(f"\ngeomean speed ember vs torch.compile: {geo:.2f}x (>1: ember faster)")
    return "\n".join(lines)


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return float(torch.tensor(xs).log().mean().exp()) if xs else float("nan")


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
    print()
    print(table(rows))
    ro_rows, ro_wrong = reduce_overhead(compile_graph)
    print()
    print(ro_table(ro_rows))
    return 1 if wrong or ro_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
