"""The Triton printer over symbolic sizes, under Triton's interpreter (CPU tensors,
``cpu_backend="triton"``): each graph is traced with symbolic sizes, compiled once, and run
at several sizes (ragged ones, rows longer than a block) against eager. Sizes reach the
kernels as int arguments, grids are computed per call, and a row of symbolic length loops.

Triton must be imported with ``TRITON_INTERPRET=1`` set (see ``test_triton.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from ember.inductor import compile_graph, decompositions

pytestmark = pytest.mark.interpreted_triton  # skipped where no interpreter (conftest)

T = torch.Tensor
OPTIONS = {"cpu_backend": "triton", "graph_cache": False}
Shapes = Sequence[tuple[int, ...]]


def _trace(fn: Callable[..., Any], inputs: list[T], dynamic: dict[int, set[int]] | None) -> Any:
    """``fn`` traced with symbolic sizes: all of them, or ``dynamic``'s dims of each input
    (the others static)."""
    table = decompositions()
    if dynamic is None:
        return make_fx(fn, tracing_mode="symbolic", decomposition_table=table)(*inputs)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = []
    for k, t in enumerate(inputs):
        dims = [
            DimDynamic.DYNAMIC if d in dynamic.get(k, ()) else DimDynamic.STATIC
            for d in range(t.dim())
        ]
        context = StatelessSymbolicContext(dynamic_sizes=dims)  # type: ignore[arg-type]
        fakes.append(mode.from_tensor(t, symbolic_context=context))
    return make_fx(fn, tracing_mode="symbolic", decomposition_table=table)(*fakes)


def _env(gm: Any) -> Any:
    for node in gm.graph.find_nodes(op="placeholder"):
        for n in getattr(node.meta.get("val"), "shape", ()):
            if isinstance(n, torch.SymInt):
                return n.node.shape_env
    raise AssertionError("no symbolic size")


def _run(
    fn: Callable[..., Any],
    sizes: Sequence[Shapes],
    dynamic: dict[int, set[int]] | None = None,
    printer: str = "triton",
    atol: float = 1e-5,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """``fn`` traced at the first of ``sizes`` and compiled once (no guard added: no size
    specialised; no fallback warning), then called at each of ``sizes`` against eager."""
    first = [torch.randn(s, dtype=dtype) for s in sizes[0]]
    gm = _trace(fn, first, dynamic)
    env = _env(gm)
    guards = len(env.guards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_graph(gm, first, OPTIONS)
    assert len(env.guards) == guards, env.guards[guards:]
    got_printer = compiled.target.printer if compiled.target is not None else "cpp"
    assert got_printer == printer
    for shapes in sizes:
        inputs = [torch.randn(s, dtype=dtype) for s in shapes]
        got, want = compiled(*inputs), fn(*inputs)
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5, equal_nan=True)
    return compiled


def _signature(source: str, kernel: str = "kernel0") -> list[str]:
    head = re.search(rf"def {kernel}\((.*)\):", source)
    assert head is not None
    return head.group(1).split(", ")


def test_pointwise_chain_takes_sizes_as_arguments() -> None:
    fn = lambda x, b: ((x * 2 + b).relu().exp() - b.abs()).sigmoid()  # noqa: E731
    sizes = [((5, 7), (7,)), ((13, 3), (3,)), ((2, 1100), (1100,)), ((31, 37), (37,))]
    compiled = _run(fn, sizes)
    assert len(re.findall(r"def kernel\d+\(", compiled.source)) == 1  # one flat kernel
    assert [a for a in _signature(compiled.source) if a.startswith("ks")]  # sizes as ints
    assert "_n = " in compiled.source and "if _n > 0:" in compiled.source  # grid per call
    assert "tl.program_id(0).to(tl.int64)" in compiled.source  # no 32-bit overflow


def test_softmax_over_a_symbolic_row_loops() -> None:
    compiled = _run(lambda x: torch.softmax(x, -1), [((5, 7),), ((13, 3),), ((3, 1500),)])
    assert re.search(r"for roffset in range\(0, ks\d+, 8\)", compiled.source)  # example: 7


def test_softmax_and_layer_norm_over_a_symbolic_batch_stay_persistent() -> None:
    def fn(x: T, w: T, b: T) -> tuple[T, T]:
        return torch.softmax(x, -1), F.layer_norm(x, (64,), w, b)

    sizes = [((5, 64), (64,), (64,)), ((37, 64), (64,), (64,)), ((2, 64), (64,), (64,))]
    compiled = _run(fn, sizes, dynamic={0: {0}})
    assert "for roffset" not in compiled.source  # the static row of 64 in one block
    assert "_ember_welford)" not in compiled.source  # two passes in registers


def test_layer_norm_over_symbolic_rows_and_batch() -> None:
    fn = lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b)  # noqa: E731
    sizes = [((5, 7), (7,), (7,)), ((13, 3), (3,), (3,)), ((3, 1500), (1500,), (1500,))]
    compiled = _run(fn, sizes, atol=1e-4)
    assert "_ember_welford)" in compiled.source  # looped Welford, lanes joined


def test_reductions_over_a_non_last_symbolic_dim() -> None:
    def fn(x: T) -> tuple[T, ...]:
        return x.sum(0), x.amax(0), x.mean(0), x.argmin(0)

    compiled = _run(fn, [((5, 7),), ((13, 3),), ((1300, 70),)], atol=1e-4)
    assert re.search(r"x0 \+ y0 \* ks\d+", compiled.source)  # columns: rows loop over y0


def test_sizes_as_values_views_and_concatenation() -> None:
    def fn(x: T) -> tuple[T, ...]:
        rows = torch.cat([x, x[1:]], 0)  # along the symbolic batch
        return x * x.size(0) + x.size(1), x.t().contiguous(), rows.exp(), rows.sum(1)

    _run(fn, [((5, 7),), ((13, 3),), ((2, 1030),)], atol=1e-4)


def test_transposed_reads_get_2d_tiles_at_every_size() -> None:
    def fn(x: T, y: T) -> tuple[T, T]:
        return x + y.t(), x.unsqueeze(0).expand(3, -1, -1).permute(2, 0, 1).contiguous()

    sizes = [((5, 7), (7, 5)), ((40, 3), (3, 40)), ((33, 65), (65, 33))]
    compiled = _run(fn, sizes)
    assert "[None, :]" in compiled.source and "[:, None]" in compiled.source  # tiles
    assert re.search(r"pid % \(+ks\d+ \+ 31\) // 32\)", compiled.source)  # tiles per size


def test_a_split_whole_reduction_at_every_size() -> None:
    """Programs and chunks of a split reduction are computed per call: one program at a
    small size, many at a large one (the example's 30,000 points chose to split)."""

    def fn(x: T) -> tuple[T, ...]:
        return x.sum(), x.amax(), x.argmin(), torch.var_mean(x, correction=0)[0], x.mean()

    compiled = _run(fn, [((100, 300),), ((3, 5),), ((70, 131),)], atol=1e-3)
    assert "_part[(_parts,)]" in compiled.source and "_n = ks" in compiled.source


def test_indices_are_32_bit_where_the_sizes_fit_else_64(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each symbolic kernel has a 32-bit twin the launcher runs while every extent fits;
    with the bound at 0 the 64-bit kernels run, and give the same values."""
    from ember.inductor import triton_index32

    def fn(x: T, y: T) -> tuple[T, ...]:
        return torch.softmax(x, -1), x.sum(0), x + y.t(), x.sum()

    sizes = [((5, 7), (7, 5)), ((40, 3), (3, 40)), ((70, 130), (130, 70))]
    compiled = _run(fn, sizes, atol=1e-4)
    kernels = compiled.source.count("\ndef launch_")
    assert kernels >= 3  # (x + y.t() runs beside the softmax: both read x)
    assert compiled.source.count("_i32[") >= kernels and "tl.int64" not in _twin(compiled.source)
    monkeypatch.setattr(triton_index32, "INDEX32_LIMIT", 0)
    compiled = _run(fn, sizes, atol=1e-4)
    assert " < 0:  # 32-bit indices" in compiled.source


def _twin(source: str) -> str:
    """The 32-bit kernels of a module (each up to its launcher)."""
    return "".join(
        part.split("\n\n\ndef launch_")[0]
        for part in source.split("@triton.jit")
        if "_i32(" in part
    )


def test_what_the_printer_declines_falls_back_to_cpp_for_every_size() -> None:
    fn = lambda x: (x.abs() + 0.5) ** torch.tensor(2.5)  # noqa: E731  POW: no interpreter libdevice
    compiled = _run(fn, [((5, 7),), ((13, 3),), ((2, 300),)], printer="cpp")
    assert 'extern "C"' in compiled.source


def test_a_slice_empty_at_some_sizes_launches_nothing_there() -> None:
    def fn(x: T) -> tuple[T, T]:
        return x[2:].exp(), x[2:].sum(0)  # no rows at a batch of 2: the sum is 0

    compiled = _run(fn, [((5, 3),), ((2, 3),), ((9, 1030),)])
    assert "if _n > 0:" in compiled.source


def test_max_and_variance_of_one_row_share_its_loop() -> None:
    def fn(x: T) -> tuple[T, ...]:  # one body reduced by max and Welford (argmax: aten)
        return x.argmax(1), x.amax(1), x.var(1)

    compiled = _run(fn, [((5, 7),), ((13, 3),), ((3, 1500),)], atol=1e-4)
    assert "_ember_welford)" in compiled.source and "tl.max(buf" in compiled.source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_over_symbolic_sizes(dtype: torch.dtype) -> None:
    fn = lambda x: ((torch.softmax(x, -1) * 3).tanh(), x.sum(0))  # noqa: E731
    sizes = [((5, 7),), ((13, 3),), ((3, 1500),)]
    compiled = _run(fn, sizes, atol=1e-2, dtype=dtype)
    assert ".to(tl.float32)" in compiled.source  # loads computed in float32


def _scores(a: T, b: T) -> T:
    return (a @ b) / 2.5  # stored in place over the mm's result


def test_a_value_only_this_kernel_reads_is_recomputed_not_stored() -> None:
    fn = lambda a, b: torch.softmax(_scores(a, b), -1)  # noqa: E731
    compiled = _run(fn, [((6, 5), (5, 9)), ((3, 5), (5, 14)), ((11, 5), (5, 2))])
    assert compiled.source.count("tl.store(") == 2  # softmax only (and its 32-bit twin)


def test_a_stage_a_later_one_reads_keeps_its_operands_memory() -> None:
    """The scores are an output, which softmax's stages read; the Triton printer recomputes
    them there from the mm's result, so the memory plan does not store the scores over it
    (it once did, and the Triton printer declined the graph): Triton takes it, with
    symbolic and static sizes alike."""
    fn = lambda a, b: (_scores(a, b), torch.softmax(_scores(a, b), -1))  # noqa: E731
    a, b = torch.randn(6, 5), torch.randn(5, 9)

    def g(a: T, b: T) -> tuple[T, T]:
        y = _scores(a, b)
        return y, torch.softmax(y, -1)

    _run(g, [((6, 5), (5, 9)), ((3, 5), (5, 14))])
    static = compile_graph(make_fx(g)(a, b), [a, b], OPTIONS)
    assert static.target is not None and static.target.printer == "triton"
    assert static.schedule is not None and not static.schedule.inplace
    torch.testing.assert_close(static(a, b), g(a, b))
    _run(fn, [((6, 5), (5, 9)), ((3, 5), (5, 14))])  # two mm calls: no overwrite, Triton


def _block(x: T, w: T) -> Any:  # a transformer block's shapes (as test_symbolic's)
    h = F.layer_norm(x, x.shape[-1:])
    att = torch.softmax(h @ h.transpose(-1, -2) / x.size(-1) ** 0.5, -1)
    return (att @ h) @ w + x, h.mean(-1), (x * x.size(0)).amax(0)


def _slices(x: T) -> Any:
    q, k, v = x.chunk(3, -1)  # slices of a symbolic dimension (x: [n, 3m])
    return F.pad(torch.cat([q, k * 2], -1), (1, 2)).exp(), (q @ v.t()).softmax(-1)


def _grads(x: T, w: T) -> Any:
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    loss = (F.gelu(x @ w).softmax(-1) * x.size(0)).sum()
    return torch.autograd.grad(loss, [x, w])


CORPUS: dict[str, tuple[Callable[..., Any], Callable[[int], list[tuple[int, ...]]]]] = {
    "block": (_block, lambda n: [(n, n + 3), (n + 3, n + 3)]),
    "slices": (_slices, lambda n: [(n, 3 * n + 3)]),
    "backward": (_grads, lambda n: [(n, 5), (5, 4)]),
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_symbolic_corpus_at_several_sizes(name: str) -> None:
    fn, shapes = CORPUS[name]
    _run(fn, [shapes(n) for n in (10, 2, 17)], atol=1e-4)


# Triton's GPU front end (Python AST -> TTIR) type-checks what the interpreter does not (a
# name live into a loop must keep its block shape there); it needs no GPU, but a triton
# imported without the interpreter: a fresh process
FRONT_END = r"""
import re, sys, importlib.util, torch, torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton._C.libtriton import ir
from ember.inductor import decompositions
from ember.inductor.codegen_triton import module_source
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import schedule

POINTERS = {torch.float32: "*fp32", torch.int64: "*i64", torch.bool: "*i1"}
NUMBERS = {"int64": "i64", "float64": "fp64"}
SCRATCH = {"float32": "fp32", "float64": "fp64", "int64": "i64"}
CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), [(5, 7)]),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), [(5, 7)]),
    "columns": (lambda x: (x.sum(0), x.amax(0), x.var(0)), [(5, 7)]),
    "one_block_then_a_loop": (lambda x, y: x.sum(-1) * y.amax(-1), [(5, 64), (5, 3000)]),
    "empty_slice": (lambda x: (x[2:].exp(), x[2:].argmax(0)), [(5, 3)]),
    "tiles": (lambda x, y: (x + y.t(), x.unsqueeze(0).expand(3, 5, 7).permute(2, 0, 1) * 2),
              [(5, 7), (7, 5)]),
    "split": (
        lambda x: (x.sum(), torch.var_mean(x, correction=0), x.argmax(), x.amin(), x.mean()),
        [(100, 300)],
    ),
    "philox": (lambda x: (torch.native_dropout(x, 0.3, True), torch.randn_like(x)), [(5, 7)]),
}
FUSED_RANDOM = {"philox"}  # lowered with fused_random: the Philox helpers (uint32 words)
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
options = backend.parse_options({"num_warps": 4})
for mode in ("real", "symbolic"):
    for name, (fn, shapes) in CASES.items():
        args = [torch.randn(s) for s in shapes]
        gm = make_fx(fn, tracing_mode=mode, decomposition_table=decompositions())(*args)
        # lowered for the Triton printer: a whole argmax stays one ordered reduction (split)
        lowered = lower_graph(gm, args, fused_random=name in FUSED_RANDOM, printer="triton")
        sched = schedule(lowered)
        source, kernel_args = module_source(sched, interpret=False)
        path = f"{sys.argv[1]}/{mode}_{name}.py"
        open(path, "w").write(source)
        spec = importlib.util.spec_from_file_location(f"m_{mode}_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        split = False
        for kernel, names in kernel_args.items():
            sig = {}
            for a in names:
                n, _, d = a.partition(":")
                if d:
                    sig[n if n.startswith("ks") else f"s_{n}"] = NUMBERS[d]
                else:
                    sig[n] = POINTERS[sched.program.buffers[n].dtype]
            # a split reduction (triton_split): scratch pointers as the launcher allocates
            # them, then the part kernel's chunk and the combine's count of parts
            launcher = source[source.index(f"def launch_{kernel}("):].split("\n\n\n")[0]
            scratch = re.findall(r"(\w+) = torch.empty\(\(_parts,\), dtype=torch.(\w+)", launcher)
            sig |= {p: "*" + SCRATCH[d] for p, d in scratch}
            split = split or bool(scratch)
            jobs = [(kernel, sig | {"parts": "i32"} if scratch else sig)]
            jobs += [(kernel + "_part", sig | {"chunk": "i32"})] if scratch else []
            # the 32-bit twins (triton_index32), their sizes passed as 32-bit ints
            narrow = {k: ("i32" if k.startswith("ks") else v) for k, v in sig.items()}
            jobs += [(f + "_i32", narrow | dict(list(g.items())[len(sig):]))
                     for f, g in jobs if hasattr(module, f + "_i32")]
            for fn, signature in jobs:
                context = ir.context()
                ir.load_dialects(context)
                backend.load_dialects(context)
                codegen = backend.get_codegen_implementation(options)
                src = ASTSource(getattr(module, fn), signature)
                src.make_ir(target, options, codegen, backend.get_module_map(), context)
        print(mode, name, "ok", "split" * split, "i32" * ("_i32(" in source))
"""


def test_generated_modules_pass_tritons_gpu_front_end(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", FRONT_END, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(" ok") == 16
    assert run.stdout.count(" ok split") == 2  # static and symbolic
    assert run.stdout.count(" i32") == 6  # symbolic cases with kernels (tiles: static sizes)
