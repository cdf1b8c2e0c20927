"""Per-op microbenchmark (issue 19, "no cliffs"): every op ember.inductor lowers, and fused chains.

    python benchmarks/bench_ops.py                      # every case, 1 thread
    python benchmarks/bench_ops.py --threads 2
    python benchmarks/bench_ops.py --ops sin,softmax --torch all --json out.json
    python benchmarks/bench_ops.py --quick --no-torch   # smoke run: a few cases, small sizes

Each case is a one-line function over inputs of 1M elements (1024x1024; reductions over
the last dim and over all), run in float32 and bfloat16 (integer and bool ops in their
own dtype) on contiguous inputs and on a transposed one (layout ``t``: the first laid-out
input is ``base.t()``; a second operand stays contiguous, so binary ops mix layouts;
``--layouts contig,t,slice`` adds every other column of a 1024x2048 tensor). A case is
compiled as users compile: ``ember.compiler.compile(fn, backend="inductor",
fullgraph=True)``, one function object (its own code object) per (case, dtype, layout),
and ``torch.compile(fn, backend="inductor", fullgraph=True)`` is the peer.

Before timing, ember's output is compared with eager's (``torch.testing.assert_close``);
a mismatch is a ``WRONG`` row, never timed. Then eager, ember (and torch) are timed
interleaved: ``--repeats`` rounds, each timing a batch of calls of each in turn, and the
median per call is kept (the thread's CPU time at 1 thread, so that a descheduled
process on this shared machine does not count; wall time with more threads).
``ember x`` and ``torch x`` are speeds relative to eager (eager time / their time;
above 1 is faster). A *cliff* is a row whose ember speed is below 0.97x eager's.

The peer is slow to compile (2-3 s a case against ember's 0.5 s), so by default
(``--torch cliffs``) it is compiled only for ``--peer-max`` (60) cliffs (the worst row of
each op and layout first), which are then timed again, all three interleaved;
``--torch all`` times it on every row, ``--no-torch`` never. ``--load out.json`` prints
a saved run's report.

Each row also says which of the graph's ops ember ran as aten calls (``aten``
column): the benchmark watches ember.inductor's lowering (instrumentation of a
private method, here only), with ember's graph cache off so every graph is lowered.
The run ends with the lowered ops no case reached and not in ``LEFT_OUT``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import ember.compiler
import ember.inductor.lower_ops
import ember.inductor.lower_random
import ember.inductor.lower_views  # registers the view lowerings
from ember.inductor import lowering, settings
from ember.inductor.compile import decompositions

FLOATS = ("float32", "bfloat16")
CLIFF = 0.97  # ember speed / eager speed below this is a cliff (the noise margin)
# Sums of the same values in another order land a small factor nearer or further from the
# exact sum (ember's float32 row sums: 1.9x eager's error); past this factor the way ember
# computes is worse than eager's, not merely different
ERROR_FACTOR = 4.0

# --- the inputs -----------------------------------------------------------------------
# Each input name maps to (maker, laid out?). A maker takes (n, dtype) and returns a tensor
# of n x n (or what the name says); a laid-out input gets the row's layout (transposed or
# sliced), the others stay contiguous. ``dtype`` is the row's float dtype.

Maker = Callable[[int, torch.dtype], torch.Tensor]


def _randn(n: int, dt: torch.dtype) -> torch.Tensor:
    return torch.randn(n, n, dtype=dt)


INPUTS: dict[str, tuple[Maker, bool]] = {
    "x": (_randn, True),
    "y": (_randn, False),  # a second operand, always contiguous
    "pos": (lambda n, dt: torch.rand(n, n, dtype=dt) + 0.1, True),  # log, sqrt, division
    "near1": (lambda n, dt: 1 + 1e-3 * torch.randn(n, n, dtype=dt), True),  # prod
    "b": (lambda n, dt: torch.rand(n, n) > 0.5, True),  # bool
    "c": (lambda n, dt: torch.rand(n, n) > 0.5, False),
    "i": (lambda n, dt: torch.randint(-1000, 1000, (n, n), dtype=torch.int32), True),
    "j": (lambda n, dt: torch.randint(-1000, 1000, (n, n), dtype=torch.int32), False),
    "row": (lambda n, dt: torch.randn(n, dtype=dt), False),  # bias, norm weight
    "idx": (lambda n, dt: torch.randint(0, n, (n, n)), True),  # gather's index
    "rows": (lambda n, dt: torch.randint(0, n, (n,)), False),  # index_select's
    "ids": (lambda n, dt: torch.randint(0, 4 * n, (4 * n,)), False),  # embedding's
    "table": (lambda n, dt: torch.randn(4 * n, n // 4, dtype=dt), False),  # 4n x n/4
    "target": (lambda n, dt: torch.randint(0, n, (n,)), False),  # cross-entropy's
    "a": (lambda n, dt: torch.randn(n, 64, dtype=dt), False),  # addmm: n x 64 @ 64 x n
    "w": (lambda n, dt: torch.randn(64, n, dtype=dt) / 8, False),
}


def _laid_out(make: Maker, n: int, dt: torch.dtype, layout: str) -> torch.Tensor:
    """``make``'s tensor in ``layout``: ``contig``, ``t`` (a transposed n x n) or ``slice``
    (every other column of n x 2n)."""
    if layout == "t":
        return make(n, dt).t()
    if layout == "slice":
        wide = torch.cat([make(n, dt), make(n, dt)], dim=1)
        return wide[:, ::2]
    return make(n, dt)


# --- the cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One function to benchmark: ``call``, an expression over ``inputs``. The namespace
    also holds ``torch``, ``F``, ``n`` (the size) and ``dt`` (the row's float dtype)."""

    name: str
    call: str
    inputs: tuple[str, ...] = ("x",)
    dtypes: tuple[str, ...] = FLOATS  # a non-float dtype names the case's own (int32, bool)
    chain: bool = False  # a fused chain rather than one op
    layouts: tuple[str, ...] = ()  # the only layouts that mean something here (empty: all)

    @property
    def laid_out(self) -> bool:
        return any(INPUTS[i][1] for i in self.inputs)


def _cases(*specs: tuple[Any, ...], **common: Any) -> list[Case]:
    return [Case(*spec, **common) for spec in specs]


UNARY = _cases(
    *[(op, f"torch.{op}(x)") for op in ("abs", "neg", "exp", "expm1", "sin", "cos", "tanh")],
    *[(op, f"torch.{op}(x)") for op in ("sigmoid", "erf", "relu", "sign", "sgn", "ceil")],
    *[(op, f"torch.{op}(x)") for op in ("floor", "trunc", "isnan")],
    *[(op, f"torch.{op}(pos)", ("pos",)) for op in ("log", "log1p", "sqrt", "rsqrt")],
    ("reciprocal", "torch.reciprocal(pos)", ("pos",)),
    ("logical_not", "torch.logical_not(b)", ("b",), ("bool",)),
    ("bitwise_not", "torch.bitwise_not(i)", ("i",), ("int32",)),
)
BINARY = _cases(
    ("add", "x + y", ("x", "y")),
    ("add_scalar", "x + 1.5"),
    ("add_alpha", "torch.add(x, y, alpha=2)", ("x", "y")),
    ("sub", "x - y", ("x", "y")),
    ("rsub_scalar", "1.5 - x"),
    ("rsub", "torch.rsub(x, y)", ("x", "y")),
    ("mul", "x * y", ("x", "y")),
    ("mul_scalar", "x * 3.0"),
    ("div", "x / pos", ("x", "pos")),
    ("div_scalar", "x / 3.0"),
    ("maximum", "torch.maximum(x, y)", ("x", "y")),
    ("minimum", "torch.minimum(x, y)", ("x", "y")),
    ("pow_int", "x ** 3"),
    ("pow_float", "pos ** 2.5", ("pos",)),
    ("pow_tensor", "pos ** y", ("pos", "y")),
    *[(op, f"torch.{op}(x, y)", ("x", "y")) for op in ("eq", "ne", "lt", "le", "gt", "ge")],
    *[(f"{op}_scalar", f"torch.{op}(x, 0.5)") for op in ("eq", "ne", "lt", "le", "gt", "ge")],
    ("where", "torch.where(b, x, y)", ("b", "x", "y")),
    ("where_scalar_other", "torch.where(b, x, 0.0)", ("b", "x")),
    ("where_scalar_self", "torch.where(b, 0.0, x)", ("b", "x")),
    ("where_scalars", "torch.where(b, 1.0, -1.0).to(dt)", ("b",)),
    ("clamp", "x.clamp(-0.5, 0.5)"),
    ("clamp_min", "x.clamp(min=0.1)"),
    ("clamp_max", "x.clamp(max=0.1)"),
    ("masked_fill", "x.masked_fill(b, 0.0)", ("x", "b")),
)
INTEGER = [
    *_cases(*[(op, f"torch.{op}(i, j)", ("i", "j")) for op in ("bitwise_and", "bitwise_or")],
            ("bitwise_xor", "torch.bitwise_xor(i, j)", ("i", "j")), dtypes=("int32",)),
    *_cases(*[(op, f"torch.{op}(b, c)", ("b", "c")) for op in ("logical_and", "logical_or")],
            ("logical_xor", "torch.logical_xor(b, c)", ("b", "c")), dtypes=("bool",)),
]  # fmt: skip
COPIES = _cases(
    ("to_other_float", "x.to(torch.float32 if dt == torch.bfloat16 else torch.bfloat16)"),
    ("to_int32", "x.to(torch.int32)"),
    ("clone", "x.clone()"),
    ("contiguous", "x.contiguous()", ("x",), FLOATS, False, ("t", "slice")),  # else a no-op
    ("copy_", "y.clone().copy_(x)", ("x", "y")),
    ("full", "torch.full((n, n), 1.5, dtype=dt)", ()),
    ("zeros", "torch.zeros(n, n, dtype=dt)", ()),
    ("ones", "torch.ones(n, n, dtype=dt)", ()),
    ("full_like", "torch.full_like(y, 1.5)", ("y",)),
    ("zeros_like", "torch.zeros_like(y)", ("y",)),
    ("ones_like", "torch.ones_like(y)", ("y",)),
    ("new_zeros", "y.new_zeros((n, n))", ("y",)),
    ("new_ones", "y.new_ones((n, n))", ("y",)),
) + _cases(
    ("arange", "torch.arange(n * n)", ()),
    ("arange_start_step", "torch.arange(1, 2 * n * n + 1, 2)", ()),
    dtypes=("int64",),
)
REDUCTIONS = _cases(
    ("sum_last", "x.sum(-1)"),
    ("sum_first", "x.sum(0)"),
    ("sum_all", "x.sum()"),
    ("mean_last", "x.mean(-1)"),
    ("mean_all", "x.mean()"),
    ("prod_last", "near1.prod(-1)", ("near1",)),
    ("prod_all", "near1.prod()", ("near1",)),
    ("amax_last", "x.amax(-1)"),
    ("amax_first", "x.amax(0)"),  # a column max: the reduced dim outer in memory
    ("amax_all", "x.amax()"),
    ("amin_last", "x.amin(-1)"),
    ("max_dim", "x.max(-1)"),
    ("argmax_last", "x.argmax(-1)"),
    ("argmax_first", "x.argmax(0)"),
    ("argmax_all", "x.argmax()"),
    ("argmin_last", "x.argmin(-1)"),
    ("var_last", "x.var(-1)"),
    ("var_mean_last", "torch.var_mean(x, -1)"),
) + _cases(
    ("any_last", "b.any(-1)", ("b",)),
    ("any_all", "b.any()", ("b",)),
    ("all_last", "b.all(-1)", ("b",)),
    ("all_all", "b.all()", ("b",)),
    dtypes=("bool",),
)
INDEXING = _cases(
    ("cat_rows", "torch.cat([x, y])", ("x", "y")),
    ("cat_cols", "torch.cat([x, y], 1)", ("x", "y")),
    ("pad", "F.pad(x, (1, 1, 1, 1))"),
    ("slice_scatter", "torch.slice_scatter(x, y[:, :512], 1, 256, 768)", ("x", "y")),
    ("gather", "torch.gather(x, 1, idx)", ("x", "idx")),
    ("index_select", "x.index_select(0, rows)", ("x", "rows")),
    ("embedding", "F.embedding(ids, table)", ("ids", "table")),
    ("index_rows", "x[rows]", ("x", "rows")),
    ("index_pairs", "x[rows[:, None], rows]", ("x", "rows")),
    ("addmm", "torch.addmm(row, a, w)", ("row", "a", "w")),
)
CHAINS = _cases(
    ("sin+cos", "torch.sin(x) + torch.cos(x)"),
    ("gelu_tanh", "F.gelu(x, approximate='tanh')"),
    ("gelu_erf", "F.gelu(x)"),
    ("erf_chain", "0.5 * (1 + torch.erf(x * 0.7071))"),
    ("x*sigmoid(x)", "x * torch.sigmoid(x)"),
    ("silu*y", "F.silu(x) * y", ("x", "y")),
    ("tanh*y+x", "torch.tanh(x) * y + x", ("x", "y")),
    ("leaky_where", "torch.where(x > 0, x, 0.1 * x)"),
    ("hardswish", "F.hardswish(x)"),
    ("softplus", "F.softplus(x)"),
    ("log1p_chain", "torch.log1p(torch.exp(-x.abs())) + torch.relu(x)"),
    ("pow_chain", "x ** 2 + 0.5 * x ** 3 - pos ** 1.5", ("x", "pos")),
    ("bias_relu", "torch.relu(x + row)", ("x", "row")),
    ("t+y", "x.t() + y", ("x", "y")),
    ("exp(x-max)", "torch.exp(x - x.amax(-1, keepdim=True))"),
    ("softmax", "torch.softmax(x, -1)"),
    ("log_softmax", "torch.log_softmax(x, -1)"),
    ("layer_norm", "F.layer_norm(x, (n,), row, row)", ("x", "row")),
    ("rms_norm", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * row", ("x", "row")),
    ("standardize", "(x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)"),
    ("cross_entropy", "F.cross_entropy(x, target)", ("x", "target")),
    ("addmm_gelu", "F.gelu(torch.addmm(row, a, w))", ("row", "a", "w")),
    chain=True,
)
CASES: dict[str, Case] = {
    c.name: c for c in UNARY + BINARY + INTEGER + COPIES + REDUCTIONS + INDEXING + CHAINS
}
QUICK = ("sin", "add", "sum_last", "sin+cos", "softmax")

_VIEW = "a view: no work of its own; its index map is inlined into the reader (see t+y, pad, cat)"
_RANDOM = "random: torch's kernels by default (fallback_random); not comparable with eager"
DECOMPOSED = "the inductor backend's decomposition table rewrites it before lowering"
LEFT_OUT: dict[str, str] = {
    **{str(op): _VIEW for op, fn in lowering.LOWERINGS.items()
       if fn.__module__ == "ember.inductor.lower_views"},
    **{str(op): _RANDOM for op, fn in lowering.LOWERINGS.items()
       if fn.__module__ == "ember.inductor.lower_random"},
    "aten.lift_fresh_copy.default": "a copy of a constant built in the graph (torch.tensor(...))",
    "aten.scalar_tensor.default": "a 0-d tensor: one element",
}  # fmt: skip


# --- watching the lowering ------------------------------------------------------------


@dataclass
class Seen:
    """The graph ops with a lowering that one compile met, and those it ran as aten calls."""

    lowered: set[str] = field(default_factory=set)
    aten: set[str] = field(default_factory=set)


@contextlib.contextmanager
def watch_lowering() -> Iterator[Seen]:
    """Record what ember.inductor lowers inside the block (graph cache off, so that a graph
    seen in an earlier run is lowered again). Instruments ``Lowerer``'s private methods:
    if they are renamed, nothing is recorded and the benchmark still runs."""
    seen, cls = Seen(), lowering.Lowerer
    lower_node, extern = getattr(cls, "_lower_node", None), getattr(cls, "extern", None)

    def _lower_node(self: Any, node: torch.fx.Node) -> Any:
        if node.target in lowering.LOWERINGS:
            seen.lowered.add(str(node.target))
        return lower_node(self, node)  # type: ignore[misc]

    def _extern(self: Any, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        if node.target in lowering.LOWERINGS:
            seen.aten.add(str(node.target))
        return extern(self, node, *args, **kwargs)  # type: ignore[misc]

    with settings.section.patch(graph_cache=False):
        if lower_node is None or extern is None:
            yield seen
            return
        cls._lower_node, cls.extern = _lower_node, _extern  # type: ignore[method-assign]
        try:
            yield seen
        finally:
            cls._lower_node, cls.extern = lower_node, extern  # type: ignore[method-assign]


# --- one row --------------------------------------------------------------------------


@dataclass
class Row:
    """One (case, dtype, layout): its check, its timings and what ember lowered."""

    op: str
    dtype: str
    layout: str
    status: str = "ok"  # ok, WRONG (differs from eager), ERROR (ember raised), skip
    eager_us: float | None = None
    ember_us: float | None = None
    torch_us: float | None = None
    ember_x: float | None = None  # eager time / ember time: above 1 is faster than eager
    torch_x: float | None = None
    aten: list[str] = field(default_factory=list)  # lowered ops ember ran as aten calls
    lowered: list[str] = field(default_factory=list)
    error: str = ""
    chain: bool = False


def build(case: Case, dtype: str, layout: str, n: int) -> tuple[Callable[..., Any], list[Any]]:
    """A fresh function (its own code object, so compile caches never mix rows) and its
    inputs."""
    dt = getattr(torch, dtype) if dtype in FLOATS else torch.float32
    torch.manual_seed(0)
    args = []
    for name in case.inputs:
        make, laid = INPUTS[name]
        args.append(_laid_out(make, n, dt, layout) if laid else make(n, dt))
    source = f"def {_ident(case.name)}({', '.join(case.inputs)}):\n    return {case.call}\n"
    namespace = {"torch": torch, "F": F, "n": n, "dt": dt}
    exec(compile(source, f"<bench_ops {case.name} {dtype} {layout}>", "exec"), namespace)
    return namespace[_ident(case.name)], args


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _close(got: Any, want: Any, fn: Callable[..., Any], inputs: list[Any]) -> None:
    """ember's result ``got`` agrees with eager's ``want``: within ``assert_close``'s default
    tolerance, or (summation order and bfloat16 rounding differ between fused and unfused
    code) no further than ``ERROR_FACTOR`` times eager's own error from a float64 run."""
    try:
        torch.testing.assert_close(got, want, equal_nan=True, check_stride=False)
    except AssertionError as e:
        ref = fn(*[a.double() if a.is_floating_point() else a for a in inputs])
        for g, w, r in zip(*map(_leaves, (got, want, ref)), strict=True):
            ours, eagers = _error(g, r), _error(w, r)
            if not (g.is_floating_point() and ours <= ERROR_FACTOR * eagers + 1e-6):
                raise AssertionError(
                    f"{e} (from float64: ember {ours:.3g}, eager {eagers:.3g})"
                ) from None


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _error(t: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference from ``ref`` (NaN where both are NaN counts as none)."""
    diff = (t.double() - ref.double()).abs()
    return float(torch.where(t.isnan() & ref.isnan(), 0.0, diff).max())


def timed(
    fns: dict[str, Callable[[], Any]], repeats: int, batch_s: float, threads: int
) -> dict[str, float]:
    """Median seconds per call of each of ``fns``, timed interleaved: each round times a
    batch of calls of every function in turn (each batch about ``batch_s`` long)."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    calls = {}
    for name, fn in fns.items():
        fn()
        start = clock()
        fn()
        calls[name] = max(1, min(1000, round(batch_s / max(clock() - start, 1e-6))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            for _ in range(calls[name]):
                fn()
            samples[name].append((clock() - start) / calls[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def run_row(case: Case, dtype: str, layout: str, args: argparse.Namespace) -> tuple[Row, dict]:
    """Check ember against eager, then time eager and ember; returns the row and what a
    later peer timing needs (the function, inputs and ember's compiled function)."""
    row = Row(case.name, dtype, layout, chain=case.chain)
    fn, inputs = build(case, dtype, layout, args.n)
    try:
        want = fn(*inputs)
    except Exception as e:  # eager has no kernel for this dtype
        row.status, row.error = "skip", f"eager: {type(e).__name__}: {str(e)[:120]}"
        return row, {}
    compiled = ember.compiler.compile(fn, backend="inductor", fullgraph=True)
    try:
        with watch_lowering() as seen:
            got = compiled(*inputs)
        row.lowered, row.aten = sorted(seen.lowered), sorted(seen.aten)
        _close(got, want, fn, inputs)
    except AssertionError as e:
        row.status, row.error = "WRONG", " ".join(str(e).split())[:300]
        return row, {}
    except Exception as e:  # ember is under test: report, carry on
        row.status, row.error = "ERROR", f"{type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc(limit=3, file=sys.stderr)
        return row, {}
    peer = {"fn": fn, "ember": compiled, "row": (case, dtype, layout)}  # inputs are rebuilt
    if args.torch == "all":
        retime_with_peer(row, peer, args)
    else:
        impls = {"eager": lambda: fn(*inputs), "ember": lambda: compiled(*inputs)}
        _record(row, timed(impls, args.repeats, args.batch_s, args.threads))
    return row, peer


def _peer(fn: Callable[..., Any], inputs: list[Any]) -> Callable[[], Any]:
    """torch.compile's function for this row, checked against eager (the peer)."""
    fresh = type(fn)(fn.__code__.replace(), fn.__globals__, fn.__name__)  # a new code object
    compiled = torch.compile(fresh, backend="inductor", fullgraph=True)
    _close(compiled(*inputs), fn(*inputs), fn, inputs)
    return lambda: compiled(*inputs)


def _record(row: Row, t: dict[str, float]) -> None:
    row.eager_us, row.ember_us = t["eager"] * 1e6, t["ember"] * 1e6
    row.ember_x = t["eager"] / t["ember"]
    if "torch" in t:
        row.torch_us, row.torch_x = t["torch"] * 1e6, t["eager"] / t["torch"]


def retime_with_peer(row: Row, peer: dict, args: argparse.Namespace) -> None:
    """Time eager, ember and torch.compile again, interleaved (a cliff's row)."""
    fn, compiled = peer["fn"], peer["ember"]
    _, inputs = build(*peer["row"], args.n)  # the same inputs again (seeded)
    try:
        torch_fn = _peer(fn, inputs)
    except Exception as e:  # the peer failing is reported, not fatal
        row.error = f"torch.compile: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        torch_fn = None
    impls = {"eager": lambda: fn(*inputs), "ember": lambda: compiled(*inputs)}
    if torch_fn is not None:
        impls["torch"] = torch_fn
    _record(row, timed(impls, args.repeats, args.batch_s, args.threads))


# --- the run and its report -----------------------------------------------------------


def selected(args: argparse.Namespace) -> list[tuple[Case, str, str]]:
    names = args.ops.split(",") if args.ops else (QUICK if args.quick else list(CASES))
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown ops {unknown}; the cases are: {', '.join(CASES)}")
    layouts = args.layouts.split(",")
    return [
        (CASES[name], dtype, layout)
        for name in names
        for dtype in CASES[name].dtypes
        for layout in _layouts(CASES[name], layouts)
    ]


def _layouts(case: Case, layouts: list[str]) -> list[str]:
    if not case.laid_out:
        return layouts[:1]
    return [layout for layout in layouts if not case.layouts or layout in case.layouts]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected row; the results as a dict (what ``--json`` saves)."""
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows: list[Row] = []
    peers: dict[int, dict] = {}
    for case, dtype, layout in selected(args):
        row, peer = run_row(case, dtype, layout, args)
        rows.append(row)
        if args.torch == "cliffs" and row.ember_x is not None and row.ember_x < CLIFF:
            peers[len(rows) - 1] = peer
        if args.verbose:
            print(format_row(row), file=sys.stderr, flush=True)
    for index in _peer_rows(rows, peers, args.peer_max):  # last: the peer compiles slowly
        retime_with_peer(rows[index], peers[index], args)
    covered = set().union(*(r.lowered for r in rows)) if rows else set()
    return {
        "meta": {
            "threads": args.threads, "n": args.n, "layouts": args.layouts, "torch": args.torch,
            "repeats": args.repeats, "quick": args.quick, "peer_max": args.peer_max,
            "torch_version": torch.__version__,
            "seconds": round(time.perf_counter() - start, 1),
        },
        "rows": [asdict(r) for r in rows],
        "left_out": LEFT_OUT,
        "not_reached": not_reached(covered),
    }  # fmt: skip


def not_reached(covered: set[str]) -> dict[str, str]:
    """The lowered ops no row's graph reached (and not left out), each with why."""
    decomposed = {str(op) for op in decompositions()}
    return {
        str(op): DECOMPOSED if str(op) in decomposed else "no case's graph has it"
        for op in lowering.LOWERINGS
        if str(op) not in covered | set(LEFT_OUT)
    }


def _peer_rows(rows: list[Row], cliffs: dict[int, dict], most: int) -> list[int]:
    """The cliffs to time the peer on: the worst row of each (op, layout), worst first and
    the layouts taking turns, so that every cause has its peer number; then the others."""
    worst = sorted(cliffs, key=lambda i: rows[i].ember_x or 0.0)
    seen: set[tuple[str, str]] = set()
    first: dict[str, list[int]] = {}
    for i in worst:
        if (rows[i].op, rows[i].layout) not in seen:
            seen.add((rows[i].op, rows[i].layout))
            first.setdefault(rows[i].layout, []).append(i)
    turns = [i for group in itertools.zip_longest(*first.values()) for i in group if i is not None]
    return (turns + [i for i in worst if i not in turns])[:most]


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_row(row: Row) -> str:
    eager = "-" if row.eager_us is None else f"{row.eager_us:.0f}"
    note = row.error or (("aten: " + ", ".join(row.aten)) if row.aten else "")
    return (
        f"| {row.op} | {row.dtype} | {row.layout} | {row.status} | {eager} | "
        f"{_x(row.ember_x)} | {_x(row.torch_x)} | {note} |"
    )


HEADER = "| op | dtype | layout | status | eager us | ember x eager | torch x eager | notes |\n" + (
    "|---|---|---|---|---|---|---|---|"
)


def report(results: dict[str, Any]) -> str:
    """The markdown table, the cliffs (worst first), failures and coverage."""
    rows = [Row(**r) for r in results["rows"]]
    meta = results["meta"]
    lines = [
        f"# ember per-op microbenchmark: {meta['threads']} thread(s), n={meta['n']}, "
        f"layouts {meta['layouts']}, peer: {meta['torch']}, {meta['seconds']} s",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    cliffs = sorted((r for r in rows if r.ember_x is not None and r.ember_x < CLIFF),
                    key=lambda r: r.ember_x or 0.0)  # fmt: skip
    lines += ["", f"## Below {CLIFF}x eager ({len(cliffs)} of {len(rows)} rows), worst first", ""]
    lines += [HEADER, *(format_row(r) for r in cliffs)]
    lines += [
        "",
        "## By op: ember x eager (torch x eager), ops with a row below",
        "",
        by_op(results),
    ]
    bad = [r for r in rows if r.status in ("WRONG", "ERROR")]
    if bad:
        lines += ["", f"## Wrong or failing ({len(bad)})", "", HEADER, *map(format_row, bad)]
    missing = results["not_reached"]
    if isinstance(missing, list):  # saved before the reasons were recorded
        missing = dict.fromkeys(missing, "?")
    for why in sorted(set(missing.values())):
        ops = ", ".join(op for op, reason in missing.items() if reason == why)
        lines += ["", f"Lowered ops no case reached ({why}): {ops}"]
    return "\n".join(lines)


def by_op(results: dict[str, Any]) -> str:
    """One line per op with a row below eager: ember's speed (torch's in brackets) in each
    dtype and layout; ``WRONG``/``ERROR`` where ember's result was not eager's."""
    rows = [Row(**r) for r in results["rows"]]
    layouts = list(dict.fromkeys(r.layout for r in rows))
    columns = [(d, lay) for lay in layouts for d in ("float32", "bfloat16")]
    cells: dict[str, dict[tuple[str, str], str]] = {}
    slow: set[str] = set()
    for r in rows:
        name = r.op if r.dtype in FLOATS else f"{r.op} ({r.dtype})"
        dtype = r.dtype if r.dtype in FLOATS else "float32"
        speed = _x(r.ember_x) + (f" ({_x(r.torch_x)})" if r.torch_x is not None else "")
        cells.setdefault(name, {})[dtype, r.layout] = speed if r.status == "ok" else r.status
        if r.status != "ok" or (r.ember_x or 1.0) < CLIFF:
            slow.add(name)
    head = " | ".join(f"{'f32' if d == 'float32' else 'bf16'} {lay}" for d, lay in columns)
    lines = [f"| op | {head} |", "|---" * (len(columns) + 1) + "|"]
    for name in (n for n in cells if n in slow):
        lines.append(f"| {name} | " + " | ".join(cells[name].get(c, "") for c in columns) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cases at n=64 (smoke run)")
    parser.add_argument("--ops", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--layouts", default="contig,t", help="of contig, t, slice")
    parser.add_argument(
        "--torch", choices=("cliffs", "all", "none"), default="cliffs",
        help="where to time torch.compile: the worst cliffs (default), every row, none",
    )  # fmt: skip
    parser.add_argument("--no-torch", dest="torch", action="store_const", const="none")
    parser.add_argument(
        "--peer-max", type=int, default=60, help="--torch cliffs: on how many rows (60)"
    )
    parser.add_argument("--n", type=int, default=None, help="inputs are n x n (1024)")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds (9)")
    parser.add_argument("--json", default="", help="save the results here")
    parser.add_argument("--load", default="", help="print the report of a saved run; run nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="print rows as they come")
    args = parser.parse_args(argv)
    args.n = args.n or (64 if args.quick else 1024)
    args.repeats = args.repeats or (3 if args.quick else 9)
    args.batch_s = 0.0005 if args.quick else 0.004
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.load:
        with open(args.load) as f:
            results = json.load(f)
        print(report(results))
        return results
    results = run(args)
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
