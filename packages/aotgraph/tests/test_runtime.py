"""The runtime: inference and training paths, RNG, backward twice, double backward, options."""

from __future__ import annotations

import copy
import operator
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from ember.aotgraph import aot_compile, default_partition


def counting(log: list[str], name: str) -> Callable[..., Any]:
    def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        log.append(name)
        return gm

    return compiler


def compile_logged(fn: Any, args: list[Any], log: list[str], **kw: Any) -> Any:
    return aot_compile(
        torch.fx.symbolic_trace(fn),
        args,
        fw_compiler=counting(log, "fw"),
        bw_compiler=counting(log, "bw"),
        inference_compiler=counting(log, "inference"),
        **kw,
    )


def test_inference_compiler_when_grad_is_off_then_training_on_demand():
    log: list[str] = []
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        f = compile_logged(lambda x: x.sin(), [x], log)
        assert not f(x).requires_grad
    assert log == ["inference"] and f.training is None
    y = f(x)  # grad mode on, x requires grad: the training path is built now
    y.sum().backward()
    assert log == ["inference", "fw", "bw"]
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_inference_compiler_when_no_input_requires_grad():
    log: list[str] = []
    f = compile_logged(lambda x: x * 2, [torch.ones(2)], log)
    assert log == ["inference"]
    assert f.partition is None and f.inference_graph is not None


def test_dropout_same_seed_same_mask_as_eager_and_consistent_gradient():
    drop = nn.Sequential(nn.Dropout(0.5)).train()
    x = torch.randn(64, requires_grad=True)
    f = aot_compile(torch.fx.symbolic_trace(drop), [x], fw_compiler=lambda gm, ex: gm)
    torch.manual_seed(3)
    got = f(x)
    torch.manual_seed(3)
    want = drop(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    kept = (got != 0).float()  # the gradient uses the mask the forward drew
    torch.testing.assert_close(x.grad, kept * 2)
    assert "bernoulli" not in f.partition.backward.code


def test_compiling_draws_no_random_numbers():
    drop = nn.Sequential(nn.Dropout(0.5)).train()
    x = torch.randn(8, requires_grad=True)
    before = torch.get_rng_state()
    aot_compile(torch.fx.symbolic_trace(drop), [x], fw_compiler=lambda gm, ex: gm)
    assert torch.equal(torch.get_rng_state(), before)  # tracing runs on fake tensors


def test_second_backward_errors_like_eager():
    w = torch.randn(4, 4, requires_grad=True)
    f = aot_compile(torch.fx.symbolic_trace(lambda x, w: (x @ w).tanh()), [torch.randn(2, 4), w],
                    fw_compiler=lambda gm, ex: gm)  # fmt: skip
    y = f(torch.randn(2, 4), w)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


def test_double_backward_raises_a_clear_error():
    x = torch.randn(3, requires_grad=True)
    f = aot_compile(torch.fx.symbolic_trace(lambda x: x.sin()), [x], fw_compiler=lambda gm, ex: gm)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"double backward through an aot_compile\.d function"):
        g.sum().backward()


def test_partition_by_name_or_callable():
    x = torch.randn(3, requires_grad=True)
    seen = []

    def mine(joint):
        seen.append(joint.num_primals)
        return default_partition(joint)

    gm = torch.fx.symbolic_trace(lambda x: x.exp())
    aot_compile(gm, [x], fw_compiler=lambda gm, ex: gm, partition=mine)
    assert seen == [1]
    with pytest.raises(ValueError, match="unknown partition 'nope'; known: default, min_cut"):
        aot_compile(gm, [x], fw_compiler=lambda gm, ex: gm, partition="nope")


def test_graphs_are_functional_aten():
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()).train()
    f = aot_compile(torch.fx.symbolic_trace(bn), [torch.randn(8, 4)], fw_compiler=lambda gm, ex: gm)
    assert f.partition is not None
    for gm in (f.partition.forward, f.partition.backward):
        for node in gm.graph.nodes:
            op = node.target
            assert not (isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable), node
    assert f.joint is not None and f.joint.mutated  # running stats are written back


@pytest.mark.parametrize("grad", [True, False])
def test_eval_batch_norm_leaves_running_stats_alone_as_eager(grad):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    twin = copy.deepcopy(model)
    for mode in ("eval", "train"):  # the mode is traced into the graph: one graph each
        getattr(model, mode)(), getattr(twin, mode)()
        x = torch.randn(2, 3, 6, 6)
        f = aot_compile(torch.fx.symbolic_trace(model), [x], fw_compiler=lambda gm, ex: gm)
        stats = [model[1].running_mean, model[1].running_var]
        before = [t._version for t in stats]
        with torch.set_grad_enabled(grad):
            got, want = f(x), twin(x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(model[1].running_mean, twin[1].running_mean)
        torch.testing.assert_close(model[1].running_var, twin[1].running_var)
        moved = [t._version != v for t, v in zip(stats, before, strict=True)]
        assert moved == [mode == "train"] * 2  # eval: no write-back, as eager writes nothing


def test_backward_graph_gets_fake_example_inputs():
    kinds = []

    def bw(gm, example_inputs):
        kinds.extend(type(t).__name__ for t in example_inputs)
        return gm

    x = torch.randn(3, requires_grad=True)
    gm = torch.fx.symbolic_trace(lambda x: x.exp())
    aot_compile(gm, [x], fw_compiler=lambda g, e: g, bw_compiler=bw)
    assert kinds and set(kinds) == {"FakeTensor"}


def _transpose_input(x):
    x.t_()
    return x * 2


def test_metadata_mutation_of_an_input_is_replayed_on_the_callers_tensor():
    gm = torch.fx.symbolic_trace(_transpose_input)
    f = aot_compile(gm, [torch.randn(2, 3)], fw_compiler=lambda g, e: g)
    x, want = torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(f(x), _transpose_input(want))
    assert (x.shape, x.stride(), x._version) == (want.shape, want.stride(), want._version)


def _mutate_leaf(x):
    x.mul_(2)
    return x.sin()


def test_mutating_an_input_that_requires_grad_errors_as_in_eager():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        _mutate_leaf(x)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        aot_compile(torch.fx.symbolic_trace(_mutate_leaf), [x], fw_compiler=lambda g, e: g)


def test_outputs_computed_under_no_grad_do_not_require_grad():
    graph = torch.fx.Graph()  # as ember's capture records `with torch.no_grad(): y = x * 2`
    x = graph.placeholder("x")
    graph.call_function(torch._C._set_grad_enabled, (False,))
    y = graph.call_function(operator.mul, (x, 2))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output((x, y))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    inp = torch.ones(3, requires_grad=True)
    f = aot_compile(gm, [inp], fw_compiler=lambda g, e: g)
    same, doubled = f(inp)
    assert same is inp and not doubled.requires_grad
    torch.testing.assert_close(doubled, torch.full((3,), 2.0))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x * 2,
        lambda x: (x * 2,),
        lambda x: [x * 2, x + 1],
        lambda x: (x * 2, x + 1),
        lambda x: {"a": x * 2, "b": (x + 1, x)},
        lambda x: ((x * 2, x + 1), x.sin()),
        lambda x: (x + 1, x),  # an input returned as it is: not the fast path
    ],
    ids=["leaf", "one-tuple", "list", "tuple", "dict", "nested", "input-out"],
)
def test_output_structure_matches_eager(fn: Callable[..., Any], grad: bool) -> None:
    """The fast paths of ``assembler`` (one leaf, flat tuple, flat list) and the general one."""
    x = torch.randn(3, requires_grad=grad)
    f = aot_compile(torch.fx.symbolic_trace(fn), [x], fw_compiler=lambda g, e: g)
    got, want = f(x), fn(x)
    assert type(got) is type(want)
    torch.testing.assert_close(got, want)
    if grad:
        leaves = [t for t in torch.utils._pytree.tree_leaves(got) if t.requires_grad]
        sum(t.sum() for t in leaves).backward()
        g_ember = x.grad.clone()
        x.grad = None
        sum(t.sum() for t in torch.utils._pytree.tree_leaves(want) if t.requires_grad).backward()
        torch.testing.assert_close(g_ember, x.grad)


def test_outputs_are_freed_when_no_backward_runs():
    """A saved view of an output must not keep the output's autograd node alive: node ->
    saved view -> its base, the output -> node is a cycle inside C++ that Python's collector
    cannot see, so every forward without a backward leaked (amax's backward saves such a
    view; 360 KB a call in the graph-breaks benchmark)."""

    def fn(x: torch.Tensor) -> Any:
        y = x.exp()
        return y, y.t().sin()  # sin's backward needs y.t(): a view of the output y

    x = torch.randn(4, 8, requires_grad=True)
    gm = torch.fx.symbolic_trace(fn)
    f = aot_compile(gm, [x], fw_compiler=lambda g, e: g, partition="default")
    y, s = f(x)
    assert f.partition.saved == ("exp", "t")
    refs = [weakref.ref(y), weakref.ref(s), weakref.ref(y.grad_fn)]
    del y, s
    assert all(r() is None for r in refs)
    y, s = f(x)  # the backward still gets the saved values
    (y.sum() + s.sum()).backward()
    grad = x.grad.clone()
    x.grad = None
    y, s = fn(x)
    (y.sum() + s.sum()).backward()
    torch.testing.assert_close(grad, x.grad)


def test_grad_mode_is_restored_when_the_compiled_graph_raises():
    def broken(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            assert not torch.is_grad_enabled()  # the inference path runs without autograd
            raise RuntimeError("kernel failed")

        return run

    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    f = aot_compile(gm, [torch.ones(2)], fw_compiler=broken)
    with pytest.raises(RuntimeError, match="kernel failed"):
        f(torch.ones(2))
    assert torch.is_grad_enabled()


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", fn()
    except RuntimeError as e:
        return "raise", e


@pytest.mark.parametrize("differentiated", [(0,), (1,), (0, 1)])
def test_a_written_saved_value_raises_only_where_eager_runs_its_formula(differentiated):
    """One node saves what eager's two nodes save (x for sin, y for cos); after y is written,
    eager raises only if cos's formula runs, and a second backward raises as in eager."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> Any:
        return x.sin(), y.cos()

    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    f = aot_compile(torch.fx.symbolic_trace(fn), [x, y], fw_compiler=lambda g, e: g)
    seen = []
    for run in (fn, f):
        xs, ys = x * 1, y * 1
        outs = run(xs, ys)
        with torch.no_grad():
            ys.add_(1)
        total = sum(outs[k].sum() for k in differentiated)
        seen.append(outcome(lambda: total.backward(retain_graph=True))[0])  # noqa: B023
        if seen[-1] != "raise":
            seen.append(outcome(lambda: total.backward())[0])  # noqa: B023
            seen.append(outcome(lambda: total.backward())[0])  # noqa: B023
    assert seen[: len(seen) // 2] == seen[len(seen) // 2 :]
    assert seen[0] == ("raise" if 1 in differentiated else "value")


class _Boxed:
    """A backward 'compiler' result taking its inputs boxed: it records, while it runs,
    whether a saved value is still alive once the list is emptied (it should not be: the
    list and the callee hold the only references)."""

    def __init__(self, gm: torch.fx.GraphModule, log: list[Any]) -> None:
        self.gm, self.log = gm, log

    def __call__(self, *args: Any) -> Any:
        self.log.append("unboxed")
        return self.gm(*args)

    def call_boxed(self, args: list[Any]) -> Any:
        from ember.aotgraph.compiler_hook import CALLED_BOXED

        mine = [weakref.ref(t) for t in args if t._base is None and t.grad_fn is None]
        values = list(args)
        args.clear()
        assert not CALLED_BOXED.get()  # only while compiling
        out = self.gm(*values)
        del values
        self.log.append(("boxed", [r() is None for r in mine]))
        return out


@pytest.mark.parametrize("retain", [False, True])
def test_a_boxed_backward_owns_the_saved_values(retain: bool) -> None:
    """``call_boxed``: the runtime hands over the saved values in a list with no other
    reference left (the autograd context's released), so they can be freed as the backward
    runs; under ``retain_graph=True`` the context keeps them and a second backward works.
    The gradients are eager's either way."""
    from ember.aotgraph.compiler_hook import CALLED_BOXED

    log: list[Any] = []
    during: list[bool] = []

    def bw(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        during.append(CALLED_BOXED.get())
        return _Boxed(gm, log)

    fn = lambda x, w: (x @ w).tanh() * 3  # noqa: E731
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    f = aot_compile(torch.fx.symbolic_trace(fn), [x, w], fw_compiler=lambda gm, ex: gm,
                    bw_compiler=bw)  # fmt: skip
    y = f(x, w).sum()
    y.backward(retain_graph=retain)
    want = torch.autograd.grad(fn(x, w).sum(), w)[0]
    torch.testing.assert_close(w.grad, want)
    assert during == [True] and log and log[0][0] == "boxed"
    # saved x (the test holds it), saved tanh output, tangent: the tangent is freed, and so
    # is the tanh output unless the graph is retained
    assert log[0][1] == [False, not retain, True], log
    if retain:
        y.backward()
        torch.testing.assert_close(w.grad, 2 * want)


class _Direct:
    """A compiled forward offering ``direct()``, as ember.inductor's does: the callable it
    runs, giving the outputs as one flat tuple (each call through it counted)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm, self.direct_calls = gm, 0

    def __call__(self, *args: Any) -> Any:
        return self.gm(*args)

    def direct(self) -> Callable[..., Any]:
        def call(*args: Any) -> tuple[Any, ...]:
            self.direct_calls += 1
            return tuple(self.gm(*args))

        return call


def _with_direct(fn: Callable[..., Any], *args: Any) -> tuple[Any, _Direct]:
    made: list[_Direct] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        made.append(_Direct(gm))
        return made[-1]

    f = aot_compile(torch.fx.symbolic_trace(fn), list(args), fw_compiler=compiler)
    return f, made[0]


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: x * 2, id="one"),
        pytest.param(lambda x: (x * 2, x.sin()), id="tuple"),
        pytest.param(lambda x: [x * 2, x.sin()], id="list"),
    ],
)
def test_a_plain_inference_call_runs_the_forward_directly(fn: Callable[..., Any]) -> None:
    """After the first call shows that nothing else is to do, an inference call is the
    forward's ``direct()`` callable and the output structure, under grad mode too."""
    x = torch.randn(4)
    f, forward = _with_direct(fn, x)
    first = f(x)
    assert f.inference is not None and f.inference.fast is not None
    for got in (first, f(x), f(x)):
        assert type(got) is type(fn(x))
        for a, b in zip(*(pytree_leaves(got), pytree_leaves(fn(x))), strict=True):
            torch.testing.assert_close(a, b)
            assert not a.requires_grad
    assert forward.direct_calls == 2
    y = torch.randn(4, requires_grad=True)  # a grad input: the training path, never direct
    assert all(t.requires_grad for t in pytree_leaves(f(y)))
    assert forward.direct_calls == 2


def pytree_leaves(tree: Any) -> list[Any]:
    return tree if isinstance(tree, list | tuple) else [tree]


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: x.add_(1), id="mutation"),
        pytest.param(lambda x: (x, x * 2), id="returns-its-input"),
        pytest.param(lambda x: {"a": x * 2}, id="dict"),
        pytest.param(lambda x: x.t(), id="view-of-input"),
    ],
)
def test_no_direct_call_where_the_runtime_has_more_to_do(fn: Callable[..., Any]) -> None:
    x = torch.randn(4, 4)
    f, _ = _with_direct(fn, x.clone())
    f(x.clone())
    assert f.inference is not None and f.inference.fast is None
    got, want = f(x.clone()), fn(x.clone())
    for a, b in zip(pytree_leaves(got), pytree_leaves(want), strict=True):
        torch.testing.assert_close(a, b)
