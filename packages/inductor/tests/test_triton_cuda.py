"""The Triton printer on a CUDA GPU, against eager: static graphs, symbolic sizes, half
precision, a backward graph. Skipped without CUDA (CI has none); on a GPU machine:

    PYTHONPATH=packages/aotgraph/src:packages/inductor/src python -m pytest \\
        packages/inductor/tests/test_triton_cuda.py

The same graphs run on CPU under Triton's interpreter in ``test_triton.py`` and
``test_triton_symbolic.py``; here they run compiled for the GPU, where block shapes,
``libdevice`` calls and 64-bit indices meet Triton's real compiler.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import compile_graph, decompositions

try:
    import triton  # noqa: F401

    _TRITON = True
except ImportError:
    _TRITON = False

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and _TRITON), reason="needs a CUDA GPU and triton"
)

T = torch.Tensor
# kernels built on the first call: these tests check the kernels' numbers from the first
# call on (background builds have their own test below)
OPTIONS = {"graph_cache": False, "background_compile": "off"}


def _compiled(fn: Callable[..., Any], inputs: Sequence[T], mode: str) -> Any:
    gm = make_fx(fn, tracing_mode=mode, decomposition_table=decompositions())(*inputs)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember.inductor")  # ran eagerly instead
        compiled = compile_graph(gm, list(inputs), OPTIONS)
    assert compiled.target is not None and compiled.target.printer == "triton"
    return compiled


def _check(fn: Callable[..., Any], sizes: Sequence[Sequence[tuple[int, ...]]], **kw: Any) -> None:
    dtype = kw.get("dtype", torch.float32)
    atol = kw.get("atol", 1e-4)
    mode = "symbolic" if len(sizes) > 1 else "real"
    make = lambda shapes: [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]  # noqa: E731
    compiled = _compiled(fn, make(sizes[0]), mode)
    for shapes in sizes:
        inputs = make(shapes)
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), atol=atol, rtol=1e-3)


CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "pointwise": (lambda x, b: ((x * 2 + b).relu().exp() - b.abs()).sigmoid(), [(37, 129), (129,)]),
    "tanh-gelu": (lambda x: F.gelu(x, approximate="tanh") + torch.log1p(x.abs()), [(1000, 33)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(300, 1000)]),
    "softmax-long": (lambda x: torch.softmax(x, -1), [(16, 20000)]),
    "layer-norm": (lambda x, w, b: F.layer_norm(x, (768,), w, b), [(77, 768), (768,), (768,)]),
    "sum-dim0": (lambda x: x.sum(0) + x.amax(0), [(4099, 65)]),
    "argmax": (lambda x: x.argmax(-1), [(64, 1000)]),
    "transposed": (lambda x: (x.t() * 3).sin().contiguous(), [(129, 65)]),
    "var": (lambda x: x.var(-1) + x.mean(-1), [(33, 5000)]),
}


@pytest.mark.parametrize("name", CASES)
def test_static_graphs_match_eager(name: str) -> None:
    fn, shapes = CASES[name]
    _check(fn, [shapes])


def test_symbolic_sizes_serve_every_size() -> None:
    def fn(x: T, w: T, b: T) -> tuple[T, T]:
        return torch.softmax(x, -1), F.layer_norm(x, (x.shape[-1],), w, b)

    _check(fn, [[(5, 64), (64,), (64,)], [(37, 64), (64,), (64,)], [(2, 64), (64,), (64,)]])
    pointwise = lambda x: (x * 2).relu() + x.sum(-1, keepdim=True)  # noqa: E731
    _check(pointwise, [[(5, 7)], [(13, 300)], [(1, 4097)]])


def test_half_precision_computes_in_float32() -> None:
    fn = lambda x: torch.softmax(x * 1.5, -1)  # noqa: E731
    _check(fn, [[(128, 1000)]], dtype=torch.float16, atol=2e-3)
    _check(fn, [[(128, 1000)]], dtype=torch.bfloat16, atol=1e-2)


def test_a_training_step_forward_and_backward() -> None:
    x = torch.randn(64, 128, device="cuda")
    w = torch.randn(256, 128, device="cuda", requires_grad=True)

    def loss(x: T, w: T) -> T:
        return F.layer_norm(F.gelu(x @ w.t()), (256,)).square().mean()

    def step(x: T, w: T) -> tuple[T, T]:
        out = loss(x, w)
        (grad,) = torch.autograd.grad(out, [w])
        return out, grad

    compiled = _compiled(step, [x, w], "real")
    torch.testing.assert_close(compiled(x, w), step(x, w), atol=1e-4, rtol=1e-3)


def test_triton_graphs_replay_from_cuda_graphs() -> None:
    """mode='reduce-overhead': inductor's forward and backward graphs (Triton kernels and
    aten's matmuls) recorded into CUDA graphs of one pool, against eager over 4 steps."""
    from ember.aotgraph import aot_compile
    from ember.aotgraph.cudagraphs import Pool, cudagraph_compiler

    def kernels(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        # background builds on (the default): the record waits for the kernels
        return compile_graph(gm, inputs, {"graph_cache": False})

    def loss(x: T, w: T, b: T) -> T:
        return F.layer_norm(F.gelu(x @ w.t() + b), (256,)).square().mean()

    w = torch.randn(256, 128, device="cuda", requires_grad=True)
    b = torch.randn(256, device="cuda", requires_grad=True)
    ref = [w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()]
    pool = Pool()
    fw, bw = (cudagraph_compiler(kernels, pool, role) for role in ("forward", "backward"))
    x0 = torch.randn(64, 128, device="cuda")
    compiled = aot_compile(
        torch.fx.symbolic_trace(loss), [x0, w, b], fw_compiler=fw, bw_compiler=bw,
        decompositions=decompositions,
    )  # fmt: skip
    for _ in range(4):
        x = torch.randn(64, 128, device="cuda")
        w.grad = b.grad = ref[0].grad = ref[1].grad = None
        out = compiled(x, w, b)
        out.backward()
        want = loss(x, *ref)
        want.backward()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(
            [w.grad, b.grad], [ref[0].grad, ref[1].grad], atol=1e-4, rtol=1e-3
        )
    graphs = [r() for r in pool.records]
    assert len(graphs) == 2  # the forward and the backward, recorded once each


def test_kernels_run_on_the_current_stream() -> None:
    """Triton's launcher takes torch's current stream of the current device: a compiled
    graph called under ``torch.cuda.stream(s)`` runs after the work queued before it on
    ``s`` (here a write of its input behind a long sleep), not on the default stream."""
    fn = lambda x: (x * 2 + 1, x.sum(), torch.softmax(x, -1))  # noqa: E731
    x = torch.zeros(256, 1000, device="cuda")
    compiled = _compiled(fn, [x], "real")
    compiled(x)  # built
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 50 ms of the side stream
        x.fill_(3.0)
        out = compiled(x)
    side.synchronize()
    torch.testing.assert_close(out, fn(torch.full_like(x, 3.0)))


def test_split_reductions_and_tiles_on_the_gpu() -> None:
    """Kernel shapes checked under the interpreter: a whole reduction split across
    programs, and 2-D tiles for a transposed read."""
    _check(lambda x: (x.sum(), x.argmax(), x.var(), x.t().contiguous() + 1), [[(300, 1001)]])


DRAW = """
@triton.jit
def draw(seeds, offsets, u, n, N: tl.constexpr):
    i = tl.arange(0, N)
    s = tl.load(seeds + i)
    o = tl.load(offsets + i)
    tl.store(u + i, _ember_rand(s, o))
    tl.store(n + i, _ember_randn(s, o))
"""


def test_philox_on_the_gpu_is_the_cpu_generator_bit_for_bit(tmp_path: Any) -> None:
    """The Philox helpers compiled for the GPU (libdevice float64 log and cos) against
    ``philox.uniform``/``normal``, which the C++ printer's numbers equal bit for bit."""
    import importlib.util
    import sys

    from ember.inductor import philox
    from ember.inductor.triton_prelude import HEADER, LIBDEVICE_IMPORT

    path = tmp_path / "draw_gpu.py"
    path.write_text(HEADER + LIBDEVICE_IMPORT + philox.triton_source(False) + DRAW)
    spec = importlib.util.spec_from_file_location("ember_test_draw_gpu", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 1 << 62, (4096,), generator=g)
    offsets = torch.randint(0, 1 << 62, (4096,), generator=g)
    u, n = torch.empty(4096, device="cuda"), torch.empty(4096, device="cuda")
    module.draw[(1,)](seeds.cuda(), offsets.cuda(), u, n, N=4096)
    assert torch.equal(u.cpu(), philox.uniform(seeds, offsets))
    assert torch.equal(n.cpu(), philox.normal(seeds, offsets))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_inputs_on_another_gpu_launch_there() -> None:
    """Triton launches on the current device: a graph of ``cuda:1`` tensors, called while
    ``cuda:0`` is current, still runs on ``cuda:1`` (the wrapper makes it current)."""
    fn = lambda x: (x.exp() * 2, x.sum(1))  # noqa: E731
    x = torch.randn(64, 300, device="cuda:1")
    compiled = _compiled(fn, [x], "real")
    with torch.cuda.device(0):
        out = compiled(x)
    torch.testing.assert_close(out, fn(x))
    assert all(t.device == x.device for t in out)


def _cuda_zoo(name: str) -> tuple[torch.nn.Module, list[T]]:
    from models import ZOO

    model, args = ZOO[name].make()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0  # random masks are the generator's business, not the compiler's
    return model.cuda(), [a.cuda() for a in args]


ZOO_NAMES = [
    "mlp",
    "cnn-eval",
    "cnn-train",
    "transformer-block",
    "gpt",
    "rnn",
    "moduledict",
    "helpers",
]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_forward_on_the_gpu(name: str) -> None:
    """Each zoo model's inference graph on CUDA tensors: Triton kernels and aten's externs
    (convolutions, matmuls) against eager."""
    model, args = _cuda_zoo(name)
    with torch.no_grad():
        gm = make_fx(model, decomposition_table=decompositions())(*args)
        compiled = compile_graph(gm, list(args), OPTIONS)
        assert compiled.target is not None and compiled.target.printer == "triton"
        torch.testing.assert_close(compiled(*args), model(*args), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["mlp", "cnn-train", "transformer-block", "gpt", "helpers"])
def test_zoo_backward_on_the_gpu(name: str) -> None:
    """A zoo model's loss and parameter gradients as one graph on CUDA, against eager."""
    from torch.func import functional_call

    model, args = _cuda_zoo(name)
    params = dict(model.named_parameters())
    names = list(params)

    def step(*flat: T) -> tuple[T, ...]:
        ps = dict(zip(names, flat[: len(names)], strict=True))
        out = functional_call(model, ps, flat[len(names) :])
        loss = sum(o.float().pow(2).mean() for o in torch.utils._pytree.tree_leaves(out))
        return (loss, *torch.autograd.grad(loss, list(ps.values())))

    inputs = [p.detach().requires_grad_() for p in params.values()] + list(args)
    gm = make_fx(step, decomposition_table=decompositions())(*inputs)
    compiled = compile_graph(gm, [t.detach() for t in inputs], OPTIONS)
    assert compiled.target is not None and compiled.target.printer == "triton"
    got = compiled(*[t.detach() for t in inputs])
    torch.testing.assert_close(got, step(*inputs), atol=1e-4, rtol=1e-3)


def test_max_autotune_on_the_gpu(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """mode='max-autotune' times every candidate on the GPU for real: the graph it keeps gives
    eager's numbers, and the choice is on disk (a second compile times nothing)."""
    import json

    from ember.inductor import autotune

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    x = torch.randn(512, 3000, device="cuda")
    fn = lambda x: torch.softmax(x * 2, -1) + x.sum(0)  # noqa: E731
    options = {**OPTIONS, "max_autotune": True}
    compiled = compile_graph(make_fx(fn)(x), [x], options)
    torch.testing.assert_close(compiled(x), fn(x), atol=1e-4, rtol=1e-3)
    records = list((tmp_path / "inductor" / "autotune").glob("*.json"))
    assert records and all(json.loads(r.read_text())["trials"] for r in records)

    def no_timing(call: Any) -> float:
        raise AssertionError("timed again: the choice on disk was not used")

    monkeypatch.setattr(autotune, "seconds_per_call", no_timing)
    assert compile_graph(make_fx(fn)(x), [x], options).source == compiled.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_template_on_the_gpu(dtype: torch.dtype) -> None:
    """The Triton matmul template (tl.dot, its epilogue fused) compiled for the GPU: a linear
    with a transposed weight, gelu and a residual, against eager."""
    from ember.inductor.knobs import Knobs, knobs

    fn = lambda x, w, b: F.gelu(F.linear(x, w, b)) + x[:, :96]  # noqa: E731
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        torch.randn(s, device="cuda", generator=g).to(dtype) * 0.1
        for s in [(300, 128), (96, 128), (96,)]
    ]
    with knobs(Knobs(matmul="template")):
        compiled = compile_graph(make_fx(fn)(*inputs), inputs, OPTIONS)
    assert "tl.dot(" in compiled.source
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.float16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), **tol)


def test_kernels_build_in_the_background_on_the_gpu() -> None:
    """The default for CUDA graphs: the first call runs as aten calls while a worker builds
    the kernels on the caller's stream; after wait_for_builds the kernels serve, and a graph
    recorded by ember.aotgraph.cudagraphs right after the first call holds the kernels."""
    from ember.aotgraph.cudagraphs import cudagraphify
    from ember.inductor.cache import wait_for_builds

    fn = lambda x: torch.softmax(x * 2, -1) + x.sum(0)  # noqa: E731
    x = torch.randn(512, 3000, device="cuda")
    compiled = compile_graph(make_fx(fn)(x), [x], {"graph_cache": False})
    assert compiled.in_background
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-4, rtol=1e-3)
    wait_for_builds()
    assert compiled._pending is None or compiled._pending.done()
    torch.testing.assert_close(compiled(x * 2), fn(x * 2), atol=1e-4, rtol=1e-3)
    assert compiled._call is compiled._built
    again = compile_graph(make_fx(fn)(x), [x], {"graph_cache": False})
    replayed = cudagraphify(again)
    for _ in range(3):  # warm-up (aten calls, the build starts), record (waits), replay
        out = replayed(x)
    assert replayed.replays >= 1 and not replayed.fallback
    torch.testing.assert_close(out, fn(x), atol=1e-4, rtol=1e-3)
    assert again._call is again._built
