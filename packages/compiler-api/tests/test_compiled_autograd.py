"""Compiled autograd: backward() captured into one compiled graph, equal to eager's engine."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree
from models import ZOO

import ember.compiler
from ember.compiler.testing import CompileCounter

TOL = {"rtol": 1e-4, "atol": 1e-5}


def scaled(s: float):
    return lambda g: g * s


def loss_of(out: object) -> torch.Tensor:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return sum((t.float().square().mean() for t in leaves), torch.zeros(()))


def assert_grads(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=name, **TOL)


def scale_output(out: object) -> object:
    """``out`` with a hook on each tensor that triples its gradient."""
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(scaled(3.0))
    return out


def train_steps(
    name: str, forward: str | None, compiler: object, steps: int = 2, hooks: bool = False
):
    """``steps`` backward passes (accumulating) of one zoo model under compiled autograd,
    and the same on a copy with eager's engine; ``hooks``: gradient hooks on both."""
    model, args = ZOO[name].make()
    reference = copy.deepcopy(model)
    if hooks:  # leaf hooks that change every parameter's gradient
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            p.register_hook(scaled(0.5))
            q.register_hook(scaled(0.5))
    run = model if forward is None else ember.compiler.compile(model, backend=forward)
    keep = scale_output if hooks else (lambda out: out)
    stats = []
    for step in range(steps):
        new = tuple(a + 0.1 * step if a.is_floating_point() else a for a in args)
        torch.manual_seed(step)
        with ember.compiler.compiled_autograd(compiler=compiler) as ca:
            loss_of(keep(run(*new))).backward()
        stats.append(ca.stats)
        torch.manual_seed(step)
        loss_of(keep(reference(*new))).backward()
    assert_grads(model, reference)
    return stats


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_grads_equal_eager_and_second_step_reuses_the_graph(name):
    counter = CompileCounter()
    first, second = train_steps(name, None, counter)
    assert (first.compiles, first.eager, second.hits) == (1, 0, 1), (first, second)
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_with_hooks_that_modify_gradients(name):
    counter = CompileCounter()
    first, second = train_steps(name, None, counter, hooks=True)
    assert (first.compiles, first.eager, second.hits) == (1, 0, 1), (first, second)
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", ["mlp", "transformer-block", "gpt", "cnn-train"])
def test_zoo_forward_compiled_by_ember_aot_eager(name):
    # ember's AOT backward node (aot_eager: an FX graph) is traced into the backward graph
    counter = CompileCounter()
    first, second = train_steps(name, "aot_eager", counter)
    assert (first.compiles, second.hits) == (1, 1), (first, second)
    assert counter.frame_count == 1


def test_aot_eager_and_inductor_compilers():
    for compiler in ("aot_eager", "inductor"):
        first, second, third = train_steps("mlp", None, compiler, steps=3)
        assert (first.compiles, second.hits, third.hits) == (1, 1, 1), (compiler, first)


def make_mlp() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return m, copy.deepcopy(m)


def hooked_loss(m: torch.nn.Module, x: torch.Tensor, scale: float) -> torch.Tensor:
    h = m[1](m[0](x))
    h.register_hook(scaled(scale))  # a non-leaf tensor hook that changes the gradient
    return m[2](h).square().sum()


def test_tensor_hooks_that_scale_gradients():
    m, ref = make_mlp()
    counter = CompileCounter()
    m[0].weight.register_hook(lambda g: g + 1)  # a leaf hook
    ref[0].weight.register_hook(lambda g: g + 1)
    for _ in range(3):
        x = torch.randn(5, 4)
        with ember.compiler.compiled_autograd(compiler=counter) as ca:
            hooked_loss(m, x, 2.0).backward()
        hooked_loss(ref, x, 2.0).backward()
    assert_grads(m, ref)
    assert counter.frame_count == 1 and ca.stats.hits == 1
    # the same hook code with another closure value is another graph (its 3.0 is baked in)
    with ember.compiler.compiled_autograd(compiler=counter) as ca:
        hooked_loss(m, x, 3.0).backward()
    hooked_loss(ref, x, 3.0).backward()
    assert_grads(m, ref)
    assert counter.frame_count == 2 and ca.stats.compiles == 1


def test_module_full_backward_hooks():
    m, ref = make_mlp()
    for mod in (m, ref):
        mod[2].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0.5,))
        mod[0].register_full_backward_pre_hook(lambda mod, go: (go[0] - 0.1,))
    counter = CompileCounter()
    for _ in range(2):
        x = torch.randn(5, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        with ember.compiler.compiled_autograd(compiler=counter) as ca:
            m(x).sin().sum().backward()
        ref(x2).sin().sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, **TOL)
    assert_grads(m, ref)
    assert counter.frame_count == 1 and ca.stats.hits == 1, ca.stats


def retained_run(m: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = m[0](x)
    h.retain_grad()
    return h, m[2](m[1](h)).square().sum()


def test_retain_grad_and_retain_graph_second_backward():
    m, ref = make_mlp()
    counter = CompileCounter()
    x = torch.randn(5, 4)
    h, loss = retained_run(m, x)
    rh, rloss = retained_run(ref, x)
    with ember.compiler.compiled_autograd(compiler=counter) as ca:
        loss.backward(retain_graph=True)
        loss.backward()  # same graph, saved values kept: a hit; gradients accumulate
        assert (ca.stats.compiles, ca.stats.hits) == (1, 1)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()  # eager frees the saved values without retain_graph
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()  # and so does the eager engine, outside the context
    rloss.backward(retain_graph=True)
    rloss.backward()
    torch.testing.assert_close(h.grad, rh.grad, **TOL)
    assert_grads(m, ref)


def test_gradient_accumulation_into_existing_grad():
    m, ref = make_mlp()
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    grads_before = [p.grad for p in m.parameters()]
    for _ in range(2):
        x = torch.randn(5, 4)
        with ember.compiler.compiled_autograd(compiler="eager"):
            m(x).square().sum().backward()
        ref(x).square().sum().backward()
    assert_grads(m, ref)
    assert all(p.grad is g for p, g in zip(m.parameters(), grads_before, strict=True))


def test_structure_change_recompiles_and_same_structure_does_not():
    m, _ = make_mlp()
    counter = CompileCounter()

    def step(act) -> None:
        with ember.compiler.compiled_autograd(compiler=counter):
            act(m(torch.randn(5, 4))).sum().backward()

    step(torch.sigmoid)
    step(torch.sigmoid)
    assert counter.frame_count == 1
    step(torch.relu)  # another graph: another compile
    assert counter.frame_count == 2
    x = torch.randn(7, 4)  # another batch size: saved sizes differ
    with ember.compiler.compiled_autograd(compiler=counter):
        torch.sigmoid(m(x)).sum().backward()
    assert counter.frame_count == 3


def test_custom_function_with_ctx_values():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s):
            ctx.s = s
            ctx.save_for_backward(x)
            return x * s

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * ctx.s + x * 0, None

    counter = CompileCounter()
    for s in (2.0, 2.0, 5.0):
        x = torch.randn(3, requires_grad=True)
        with ember.compiler.compiled_autograd(compiler=counter):
            Scale.apply(x, s).sin().sum().backward()
        want = torch.autograd.grad(Scale.apply(x, s).sin().sum(), x)[0]
        torch.testing.assert_close(x.grad, want)
    assert counter.frame_count == 2  # ctx.s is part of the structure


def broken(gm, example_inputs):
    raise ValueError("no")


def test_inductor_forward_backward_graph_is_traced():
    # ember's AOT node from the inductor backend: its aten FX backward graph is recorded
    m, ref = make_mlp()
    fast = ember.compiler.compile(m, backend="inductor")
    counter = CompileCounter()
    for _ in range(2):
        x = torch.randn(5, 4)
        with ember.compiler.compiled_autograd(compiler=counter) as ca:
            fast(x).square().sum().backward()
        ref(x).square().sum().backward()
    assert_grads(m, ref)
    assert counter.frame_count == 1 and ca.stats.hits == 1, ca.stats
    assert any("mm" in str(n.target) for n in counter.graphs[0].graph.nodes)


@pytest.mark.parametrize(
    "case, reason",
    [
        ("create_graph", "create_graph=True"),
        ("side_effect_hook", "returned None"),
        ("closure_tensor", "neither saved"),
        ("post_accumulate", "post-accumulate-grad hook"),
        ("broken_compiler", "the compiler failed: ValueError: no"),
        ("item_hook", "from a tensor's data"),
    ],
)
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_fallbacks_run_eager_with_a_reason(case, reason):
    m, ref = make_mlp()
    compiler = broken if case == "broken_compiler" else "eager"
    seen: list[torch.Tensor] = []
    mask = torch.randn(5, 8)
    if case == "post_accumulate":
        m[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad))
    for _ in range(2):
        x = torch.randn(5, 4)
        with ember.compiler.compiled_autograd(compiler=compiler) as ca:
            h = m[0](x)
            if case == "side_effect_hook":
                h.register_hook(lambda g: seen.append(g))
            if case == "closure_tensor":
                h.register_hook(lambda g: g * mask)
            if case == "item_hook":
                h.register_hook(lambda g: g / g.abs().max().item())
            m[2](m[1](h)).square().sum().backward(create_graph=case == "create_graph")
        r = ref[0](x)
        if case == "closure_tensor":
            r.register_hook(lambda g: g * mask)
        if case == "item_hook":
            r.register_hook(lambda g: g / g.abs().max().item())
        ref[2](ref[1](r)).square().sum().backward()
        assert reason in ca.stats.reasons[0], ca.stats
        assert ca.stats.hits == 0 and ca.stats.eager + ca.stats.compiles == 1, ca.stats
    assert_grads(m, ref)
    if case in ("side_effect_hook", "post_accumulate"):
        assert len(seen) == 2  # the side effect ran on every step, as in eager


def test_outside_the_context_nothing_changes():
    x = torch.ones(2, requires_grad=True)
    with ember.compiler.compiled_autograd(compiler="eager"):
        pass
    assert torch.autograd.backward.__module__ == "torch.autograd"
    (x * 2).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 2.0))


def test_hook_on_a_cpp_node_is_not_skipped():
    # registered straight on the node, it is not in the key: the recording sees the engine
    # call it and refuses, so every step runs it in the eager engine
    calls: list[int] = []
    for _ in range(2):
        x = torch.randn(3, requires_grad=True)
        with ember.compiler.compiled_autograd(compiler="eager") as ca:
            y = x.sin()
            y.grad_fn.register_prehook(lambda go: calls.append(1))
            y.sum().backward()
        torch.testing.assert_close(x.grad, x.cos())
        assert ca.stats.eager == 1 and "did not see registered" in ca.stats.reasons[0]
    assert len(calls) == 2


def test_saved_tensor_written_in_place_raises_eagers_error():
    w = torch.randn(3, requires_grad=True)
    for compiled in (False, True):
        e = (w * 1).exp()
        loss = e.sum()
        with torch.no_grad():
            e.add_(1)  # exp saved its result
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            if compiled:
                with ember.compiler.compiled_autograd(compiler="eager"):
                    loss.backward()
            else:
                loss.backward()


def test_a_hook_that_removes_itself():
    x = torch.randn(3, requires_grad=True)
    handles = []

    def once(g):
        handles[0].remove()
        return g * 3

    with ember.compiler.compiled_autograd(compiler="eager"):
        y = x.exp()
        handles.append(y.register_hook(once))
        y.sum().backward()
        assert not y._backward_hooks  # removed, and not put back by the recording
    torch.testing.assert_close(x.grad, 3 * x.exp())


def test_leaves_given_one_gradient_tensor_do_not_share_their_grad():
    # add's backward hands the same tensor to both biases: eager copies it for the second
    # .grad; sharing it, the next step's in-place accumulation would add twice
    a, b = torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3, requires_grad=True)
    want = torch.zeros(2, 3)
    for _ in range(3):
        x = torch.randn(2, 3)
        with ember.compiler.compiled_autograd(compiler="eager"):
            ((x + a + b) ** 2).sum().backward()
        want += (2 * (x + a + b)).detach()
    torch.testing.assert_close(a.grad, want)
    torch.testing.assert_close(b.grad, want)
    assert a.grad.untyped_storage().data_ptr() != b.grad.untyped_storage().data_ptr()


def test_an_unhashable_compiler_object():
    class Backend:
        __hash__ = None  # type: ignore[assignment]

        def __init__(self):
            self.graphs = 0

        def __eq__(self, other):
            return self is other

        def __call__(self, gm, example_inputs):
            self.graphs += 1
            return gm.forward

    backend = Backend()
    x = torch.randn(3, requires_grad=True)
    for _ in range(2):
        with ember.compiler.compiled_autograd(compiler=backend) as ca:
            x.exp().sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.exp())
    assert backend.graphs == 1 and ca.stats.hits == 1
