"""The polyfills torch.optim's steps need, checked against torch itself, and one capture."""

from __future__ import annotations

import itertools
import typing
from typing import Any

import pytest
import torch
from torch.optim.optimizer import _stack_if_compiling

from ember.capture import hook, polyfills
from ember.capture.frame_compiler import FrameCompiler
from ember.capture.polyfills import torch_foreach, torch_optim, torch_tensor


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, 2, generator=g) + 0.5, torch.rand(4, generator=g) + 0.5]


# (name, the arguments after the first tensor list): each kind of argument the optimizers pass
FOREACH_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("_foreach_add_", (_tensors(1),), {"alpha": 0.5}),
    ("_foreach_add", (_tensors(1),), {"alpha": -2.0}),
    ("_foreach_add_", (1,), {}),
    ("_foreach_mul_", (0.9,), {}),
    ("_foreach_mul", (_tensors(2),), {}),
    ("_foreach_div_", ([2.0, 4.0],), {}),
    ("_foreach_lerp_", (_tensors(3), 0.1)),
    ("_foreach_addcmul_", (_tensors(3), _tensors(4), 0.25), {}),
    ("_foreach_addcdiv_", (_tensors(3), _tensors(4), [-0.5, -0.25]), {}),
    ("_foreach_addcdiv_", (_tensors(3), _tensors(4), torch.tensor([-0.5, 2.0])), {}),
    ("_foreach_maximum_", (_tensors(5),), {}),
    ("_foreach_sqrt", (), {}),
    ("_foreach_neg", (), {}),
    ("_foreach_reciprocal_", (), {}),
    ("_foreach_sub_", (1,), {}),
]


@pytest.mark.parametrize("call", FOREACH_CALLS, ids=[c[0] for c in FOREACH_CALLS])
def test_foreach_polyfill_does_what_torch_does(call: tuple[Any, ...]) -> None:
    name, args, kwargs = (*call, {})[:3]
    ours, theirs = _tensors(0), _tensors(0)
    got = torch_foreach.FOREACH[name](ours, *args, **kwargs)
    expected = getattr(torch, name)(theirs, *args, **kwargs)
    assert (got is ours) == (expected is theirs) == name.endswith("_")  # in place: the list
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_foreach_pow_of_a_scalar_base() -> None:
    steps = [torch.tensor(2.0), torch.tensor(3.0)]
    got = torch_foreach.FOREACH["_foreach_pow"](0.5, steps)
    assert [t.item() for t in got] == [0.25, 0.125]


def test_every_foreach_polyfill_stands_for_a_torch_function() -> None:
    for name in torch_foreach.FOREACH:
        assert polyfills.lookup(getattr(torch, name)) is torch_foreach.FOREACH[name]


def test_tensor_method_polyfills_rewrite_only_a_tensor_value() -> None:
    t, a, b = torch.ones(2), torch.full((2,), 3.0), torch.full((2,), 2.0)
    torch_tensor.addcmul_(t, a, b, value=torch.tensor(0.5))
    assert t.tolist() == [4.0, 4.0]
    torch_tensor.addcdiv_(t, a, b, value=2)
    assert t.tolist() == [7.0, 7.0]
    assert polyfills.lookup_tensor_method("addcdiv_") is torch_tensor.addcdiv_
    with pytest.raises(ValueError, match="no tensor method"):
        polyfills.tensor_method("no_such_method")(lambda self: self)


def test_closure_polyfill_checks_its_free_variables() -> None:
    with pytest.raises(ValueError, match="already has a polyfill"):
        polyfills.closure_polyfill(torch_optim.USE_GRAD_CODE, "func")(lambda f: f)
    with pytest.raises(ValueError, match="no free variables"):
        polyfills.closure_polyfill(polyfills.forwarded_call.__code__, "x")(lambda f: f)


def test_small_polyfills() -> None:
    assert polyfills.lookup(typing.cast)(int, "x") == "x"
    assert list(polyfills.lookup(itertools.chain)([1], (2, 3))) == [1, 2, 3]
    label = polyfills.lookup(torch.autograd.profiler.record_function)("step")
    with label as entered:
        assert entered.name == "step"


def _sgd_step(opt: torch.optim.Optimizer) -> None:
    opt.step()


def test_an_optimizer_step_is_one_graph_of_foreach_updates() -> None:
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    opt = torch.optim.SGD(params, lr=0.25, foreach=True)
    compiler = FrameCompiler(
        lambda gm, inputs: gm.forward, "eager", entry_codes=(_sgd_step.__code__,)
    )
    with hook.intercepting(compiler):
        _sgd_step(opt)
    assert [p.flatten().tolist() for p in params] == [[0.5] * 3, [0.5] * 4]
    (compiled,) = compiler.stats.compiled
    targets = [n.target for n in compiled.graph.graph.nodes if n.op != "placeholder"]
    assert targets.count(torch.Tensor.add_) == 2, compiled.graph.code  # one per parameter
    assert not compiler.stats.breaks and not compiler.stats.failures


def test_an_init_group_wrapped_by_torchs_compiler_is_traced_itself() -> None:
    # once torch.compile ran, every Optimizer._init_group is wrapped in its disable(): the
    # wrapper carries the original, which ember traces (other wrapped functions stay)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    wrapper._torchdynamo_orig_callable = torch.optim.SGD._init_group  # type: ignore[attr-defined]
    assert polyfills.lookup(wrapper) is torch.optim.SGD._init_group
    wrapper._torchdynamo_orig_callable = _sgd_step  # type: ignore[attr-defined]
    assert polyfills.lookup(wrapper) is None


def _adamw_step(opt: torch.optim.Optimizer) -> None:
    opt.step()


def test_foreach_adamw_step_sizes_stay_a_list_not_a_stack() -> None:
    # torch stacks the per-parameter step sizes while compiling (for its _foreach_addcdiv_):
    # a cat of 0-d values between the inductor backend's kernels. ember's foreach loops
    # take the list as it is: no stack in the graph, the same update.
    def params() -> list[torch.nn.Parameter]:
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2, 2))]
        for p in ps:
            p.grad = torch.randn_like(p)
        return ps

    assert polyfills.lookup(_stack_if_compiling)([1.0, 2.0]) == [1.0, 2.0]
    want, mine = params(), params()
    eager = torch.optim.AdamW(want, lr=0.1, foreach=True)
    opt = torch.optim.AdamW(mine, lr=0.1, foreach=True)
    eager.step(), opt.step()  # the first step makes the state (lazily, eagerly)
    compiler = FrameCompiler(
        lambda gm, inputs: gm.forward, "eager", entry_codes=(_adamw_step.__code__,)
    )
    with hook.intercepting(compiler):
        _adamw_step(opt)
    eager.step()
    (compiled,) = compiler.stats.compiled
    targets = {n.target for n in compiled.graph.graph.nodes}
    assert not targets & {torch.stack, torch.cat}, compiled.graph.code
    assert not compiler.stats.breaks and not compiler.stats.failures
    for a, b in zip(mine, want, strict=True):
        torch.testing.assert_close(a, b)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opt.state[a][key], eager.state[b][key])
