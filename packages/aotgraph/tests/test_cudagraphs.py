"""CUDA graphs around compiled graphs (ember.aotgraph.cudagraphs), against eager.

The first tests run everywhere: what runs without a CUDA graph, and why. The rest need a
CUDA GPU (CI has none); on a GPU machine, with no install:

    PYTHONPATH=packages/aotgraph/src python -m pytest packages/aotgraph/tests/test_cudagraphs.py
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aotgraph import aot_compile
from ember.aotgraph.cudagraphs import CUDAGraphed, Pool, cudagraph_compiler, cudagraphify, unfit

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def as_is(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
    return gm


# ---- everywhere ---------------------------------------------------------------------------


def test_cpu_inputs_run_as_they_are() -> None:
    g = cudagraphify(lambda x, y: [x + y, x * y])
    x, y = torch.randn(3), torch.randn(3)
    for _ in range(3):
        out = g(x, y)
        torch.testing.assert_close(out, [x + y, x * y])
    assert g.fallback == "input 0 is on cpu, not on a CUDA device" and g.replays == 0


def test_generator_input_is_refused() -> None:
    g = CUDAGraphed(lambda gen, x: [x], Pool())
    g(torch.Generator(), torch.ones(1))
    assert g.fallback == "input 0 is a torch.Generator, whose state a graph cannot advance"


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: x.nonzero(), "nonzero calls nonzero, which waits for the device"),
        (lambda x: x.sum().item(), "item calls item, which waits for the device"),
        (lambda x: x.add_(1), "add_ (aten.add_.Tensor) writes into an input"),
    ],
)
def test_unfit_graphs(fn: Callable[..., Any], why: str) -> None:
    gm = make_fx(fn)(torch.ones(3, device="meta")) if "add_" in why else None
    assert unfit(gm or torch.fx.symbolic_trace(fn)) == why


def test_a_value_on_the_cpu_is_unfit() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.cpu() + 1)
    for node in gm.graph.nodes:  # as a trace of CUDA inputs records them
        node.meta["val"] = torch.empty(3, device="cpu" if node.name == "cpu" else "meta")
    assert unfit(gm) == "cpu is a CPU tensor"


def test_fit_graph() -> None:
    fn = lambda x, w: (x @ w).relu().sum(-1)  # noqa: E731
    gm = make_fx(fn)(torch.ones(2, 3, device="meta"), torch.ones(3, 4, device="meta"))
    assert unfit(gm) == ""


def test_a_role_is_one_of_three() -> None:
    with pytest.raises(ValueError, match="role='training': choose one of"):
        cudagraph_compiler(as_is, Pool(), "training")


def test_compiler_keeps_cpu_graphs_as_they_are() -> None:
    seen: list[Any] = []

    def inner(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        seen.append(gm)
        return gm

    compiler = cudagraph_compiler(inner, Pool(), "inference")
    gm = torch.fx.symbolic_trace(lambda x: x * 3)
    assert compiler(gm, [torch.ones(2)]) is gm and seen == [gm]


# ---- on a GPU -----------------------------------------------------------------------------


@cuda
def test_replays_with_new_inputs() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [(x * y).sin() + 1, x.sum(0)]

    g = cudagraphify(f)
    for _ in range(5):
        x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")
        torch.testing.assert_close(g(x, y), f(x, y))
    assert g.fallback == "" and g.replays == 4  # call 1 warms up, 2 records and replays


@cuda
def test_one_record_per_shape() -> None:
    g = cudagraphify(lambda x: [x.exp()])
    for n in (8, 16, 8, 16, 8):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(g(x)[0], x.exp())
    assert sorted(k[0][0] for k, r in g.records.items() if r is not None) == [
        torch.Size([8]),
        torch.Size([16]),
    ]


@cuda
def test_noncontiguous_and_expanded_inputs() -> None:
    g = cudagraphify(lambda x, b: [x * 2 + b])
    base = torch.randn(16, 16, device="cuda")
    for _ in range(3):
        x, b = base.t()[::2], torch.randn(16, device="cuda").expand(8, 16)
        torch.testing.assert_close(g(x, b)[0], x * 2 + b)
        base += 1


@cuda
def test_parameters_are_read_in_place() -> None:
    w = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))
    g = cudagraphify(lambda x, w: [x @ w])
    x = torch.randn(4, 8, device="cuda")
    g(x, w)
    g(x, w)
    record = next(r for r in g.records.values() if r is not None)
    assert [c[0] for c in record.copies] == [0]  # only x is copied in
    with torch.no_grad():
        w.mul_(2)  # an optimizer step: in place, the graph sees it
    torch.testing.assert_close(g(x, w)[0], x @ w)


@cuda
def test_outputs_of_the_previous_replay_are_overwritten() -> None:
    g = cudagraphify(lambda x: [x + 1])
    x = torch.zeros(4, device="cuda")
    g(x)
    first = g(x)[0]
    second = g(x + 5)[0]
    torch.testing.assert_close(second, torch.full((4,), 6.0, device="cuda"))
    with pytest.raises(RuntimeError, match="later replay has overwritten"):
        first.sum()


@cuda
def test_dead_outputs_are_not_marked() -> None:
    g = cudagraphify(lambda x: [x + 1])
    x = torch.zeros(4, device="cuda")
    for _ in range(4):
        out = g(x)[0].clone()  # the graph's own output dies at once
    torch.testing.assert_close(out, x + 1)


@cuda
def test_copy_outputs() -> None:
    g = cudagraphify(lambda x: [x + 1], copy_outputs=True)
    x = torch.zeros(4, device="cuda")
    g(x)
    first = g(x)[0]
    g(x + 5)
    torch.testing.assert_close(first, x + 1)


@cuda
def test_outputs_that_alias_each_other_and_inputs() -> None:
    def f(x: torch.Tensor) -> list[torch.Tensor]:
        y = x * 2
        return [y, y[1:], x[:2]]

    g = cudagraphify(f)
    for _ in range(3):
        x = torch.randn(4, device="cuda")
        y, tail, head = g(x)
        torch.testing.assert_close(y, x * 2)
        assert tail.data_ptr() == y.data_ptr() + 4 and head.data_ptr() == x.data_ptr()


@cuda
def test_a_graph_that_waits_for_the_device_runs_as_it_is() -> None:
    def f(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * int(x.sum().item() > 0)]  # waits for the device: no capture

    g = cudagraphify(f)
    x = torch.ones(3, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(g(x)[0], x)
    assert g.fallback.startswith("it waits for the device") and g.replays == 0
    torch.randn(2, device="cuda")  # the random generator is not left in capture mode
    torch.testing.assert_close(torch.ones(2, device="cuda") + 1, torch.full((2,), 2.0).cuda())


@cuda
def test_training_pair_in_one_pool() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).cuda()
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def f(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = params
        h = torch.nn.functional.gelu(x @ w1.t() + b1)
        return ((h @ w2.t() + b2) ** 2).mean()

    pool = Pool()
    fw, bw = (cudagraph_compiler(as_is, pool, role) for role in ("forward", "backward"))
    params = list(model.parameters())
    x0 = torch.randn(8, 16, device="cuda")
    g = aot_compile(torch.fx.symbolic_trace(f), [x0, *params], fw_compiler=fw, bw_compiler=bw)
    for _ in range(4):
        x = torch.randn(8, 16, device="cuda")
        for p in params + ref:
            p.grad = None
        g(x, *params).backward()
        f(x, *ref).backward()
        for p, r in zip(params, ref, strict=True):
            torch.testing.assert_close(p.grad, r.grad)
    assert len([r for r in pool.records if r() is not None]) == 2  # forward and backward


@cuda
def test_a_held_view_keeps_the_memory() -> None:
    g = cudagraphify(lambda x: x * 2)  # one tensor out, one tensor back
    x = torch.arange(4.0, device="cuda")
    g(x)
    tail = g(x)[1:]  # a view: its memory cannot be marked, so the next call does not replay
    torch.testing.assert_close(g(x + 10), (x + 10) * 2)
    torch.testing.assert_close(tail, x[1:] * 2)
    assert g.held == 1 and g.replays == 1
    del tail
    torch.testing.assert_close(g(x + 1), (x + 1) * 2)
    assert g.replays == 2


def _two_micro_batches(copy_grads: bool) -> tuple[list[CUDAGraphed], torch.Tensor, Any]:
    """A graph of ``(x @ w).tanh().sum()`` whose forward and backward replay from CUDA
    graphs of one pool (the backward's outputs copied if ``copy_grads``), and a step that
    runs two forwards, then their backwards, accumulating into ``w.grad``."""
    pool, made = Pool(), []

    def compiler(copy: bool, role: str) -> Callable[..., Any]:
        def compile_one(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            made.append(cudagraph_compiler(as_is, pool, role, copy_outputs=copy)(gm, inputs))
            return made[-1]

        return compile_one

    w = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))
    fn = lambda x, w: (x @ w).tanh().sum()  # noqa: E731
    g = aot_compile(torch.fx.symbolic_trace(fn), [torch.ones(2, 8, device="cuda"), w],
                    fw_compiler=compiler(False, "forward"),
                    bw_compiler=compiler(copy_grads, "backward"))  # fmt: skip

    def step(xs: list[torch.Tensor], weight: torch.Tensor, compiled: bool) -> None:
        weight.grad = None
        outs = [(g if compiled else fn)(x, weight) for x in xs]
        for out in reversed(outs):
            out.backward()

    return made, w, step


def _three_steps_like_eager(w: torch.Tensor, step: Any) -> None:
    """Three steps of ``step`` on ``w`` (compiled) and on a copy (eager): equal gradients."""
    ref = w.detach().clone().requires_grad_()
    for _ in range(3):
        xs = [torch.randn(2, 8, device="cuda") for _ in range(2)]
        step(xs, w, True)
        step(xs, ref, False)
        torch.testing.assert_close(w.grad, ref.grad)


@cuda
def test_two_forwards_before_their_backwards() -> None:
    """The first forward's saved tensors are still held when the second forward runs, which
    then runs without replaying over them."""
    made, w, step = _two_micro_batches(copy_grads=True)
    _three_steps_like_eager(w, step)
    forward = made[0]
    assert isinstance(forward, CUDAGraphed) and forward.replays >= 2 and forward.held >= 2
    gc.collect()


@cuda
def test_gradient_accumulation_without_copies() -> None:
    """The backward's outputs accumulated into .grad over two micro-batches, as they are:
    autograd copies a gradient it cannot take over, so .grad never sits in the graph's
    memory when a replay overwrites it."""
    _, w, step = _two_micro_batches(copy_grads=False)
    _three_steps_like_eager(w, step)
