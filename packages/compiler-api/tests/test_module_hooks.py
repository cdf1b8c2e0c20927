"""Modules with forward hooks are traced with their hooks into one graph.

``Module.__call__``'s hooks run in torch's order (``polyfills/torch_nn.py``); the module's
hook dicts and the global ones are guarded, so registering or removing a hook between calls
recompiles. Backward hooks are not traced: the module's call runs natively.
"""

from __future__ import annotations

import pytest
import torch

import ember.compiler
from ember.compiler.testing import CompileCounter

X = torch.randn(2, 4)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.lin(x) * scale


def _compiled(model, **kwargs):
    """A compiled function calling ``model``: its hooks are traced with its forward. (The
    hooks of a module given to ``compile`` itself run natively around its compiled forward:
    ``test_the_compiled_module_s_own_hooks_run_around_it``.)"""

    def call(*args, **kw):
        return model(*args, **kw)

    counter = CompileCounter()
    return counter, ember.compiler.compile(call, backend=counter, **kwargs)


def test_pre_and_post_hooks_that_observe_are_one_graph():
    model = Net()
    log = []
    model.register_forward_pre_hook(lambda m, args: log.append(("pre", len(args))))
    model.lin.register_forward_hook(lambda m, args, out: log.append(("post", tuple(out.shape))))
    want = model(X)
    expected_log = list(log)
    log.clear()
    counter, compiled = _compiled(model, fullgraph=True)
    torch.testing.assert_close(compiled(X), want)
    assert log == expected_log == [("pre", 1), ("post", (2, 4))]
    assert counter.frame_count == 1


def test_hooks_that_replace_arguments_and_results():
    model = Net()
    model.register_forward_pre_hook(lambda m, args: args[0] * 2)  # not a tuple: wrapped
    model.register_forward_pre_hook(lambda m, args: (args[0] + 1,))
    model.lin.register_forward_hook(lambda m, args, out: out.relu())
    model.register_forward_hook(lambda m, args, out: out + args[0].sum())
    counter, compiled = _compiled(model, fullgraph=True)
    torch.testing.assert_close(compiled(X), model(X))
    assert counter.frame_count == 1


def test_hooks_with_kwargs():
    model = Net()

    def pre(m, args, kwargs):
        return args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 3}

    def post(m, args, kwargs, out):
        return out - kwargs["scale"]

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    counter, compiled = _compiled(model, fullgraph=True)
    torch.testing.assert_close(compiled(X, scale=2.0), model(X, scale=2.0))
    assert counter.frame_count == 1


def test_a_pre_hook_with_kwargs_returning_a_bad_value_raises_as_torch_does():
    model = Net()
    model.register_forward_pre_hook(lambda m, a, k: 5, with_kwargs=True)
    with pytest.raises(RuntimeError, match="must return None or a tuple") as eager:
        model(X)
    compiled = ember.compiler.compile(model, backend="eager")
    with pytest.raises(RuntimeError) as got:
        compiled(X)
    assert str(got.value) == str(eager.value)


def test_global_hooks_are_traced_and_guarded():
    model = Net()
    log = []
    counter, compiled = _compiled(model)
    compiled(X)
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: log.append(type(m).__name__)
    )
    try:
        torch.testing.assert_close(compiled(X), model(X))
    finally:
        handle.remove()
    assert log == ["Linear", "Net", "Linear", "Net"]  # compiled, then eager
    assert counter.frame_count == 2 and compiled.stats.breaks == []
    compiled(X)  # the hook is gone: the first entry serves again
    assert counter.frame_count == 2 and len(log) == 4


def test_registering_or_removing_a_hook_between_calls_recompiles():
    model = Net()
    counter, compiled = _compiled(model)
    torch.testing.assert_close(compiled(X), model(X))
    handle = model.register_forward_hook(lambda m, a, out: out * 10)
    torch.testing.assert_close(compiled(X), model(X))
    handle.remove()
    torch.testing.assert_close(compiled(X), model(X))
    assert counter.frame_count == 2


def test_a_stateful_hook_object_is_read_each_call():
    class Scale:
        def __init__(self):
            self.k = 2.0

        def __call__(self, m, args, out):
            return out * self.k

    model = Net()
    hook = Scale()
    model.register_forward_hook(hook)
    compiled = ember.compiler.compile(model, backend="eager")
    torch.testing.assert_close(compiled(X), model(X))
    hook.k = 5.0
    torch.testing.assert_close(compiled(X), model(X))


def test_a_hook_registered_during_the_call():
    model = Net()
    log = []

    def pre(m, args):
        # a forward hook registered by a pre-hook runs in the same call (torch reads the
        # dict of forward hooks after forward)
        if not log:
            m.register_forward_hook(lambda m, a, out: out + 100)
        log.append(1)

    model.register_forward_pre_hook(pre)
    eager_model = Net()
    eager_model.load_state_dict(model.state_dict())
    eager_log = []

    def eager_pre(m, args):
        if not eager_log:
            m.register_forward_hook(lambda m, a, out: out + 100)
        eager_log.append(1)

    eager_model.register_forward_pre_hook(eager_pre)
    compiled = ember.compiler.compile(model, backend="eager")
    for _ in range(3):
        torch.testing.assert_close(compiled(X), eager_model(X))
    assert log == eager_log
    assert len(model._forward_hooks) == len(eager_model._forward_hooks) == 1


def test_a_hook_registered_inside_the_compiled_function():
    model = Net()

    def f(x):
        handle = model.register_forward_hook(lambda m, a, out: out * 3)
        y = model(x)
        handle.remove()
        return y + model(x)

    want = f(X)
    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(X), want)
    torch.testing.assert_close(compiled(X), want)
    assert not model._forward_hooks


def test_backward_hooks_run_natively_with_a_reason():
    model = Net()
    grads = []
    model.register_full_backward_hook(lambda m, gi, go: grads.append(go[0].shape))
    compiled = ember.compiler.compile(lambda x: model(x).sin(), backend="eager")
    x = torch.randn(2, 4, requires_grad=True)
    compiled(x).sum().backward()
    assert grads == [torch.Size([2, 4])]
    assert any("backward hooks" in str(b) for b in compiled.stats.failures + compiled.stats.breaks)


def test_the_compiled_module_s_own_hooks_run_around_it():
    model = Net()
    model.register_forward_pre_hook(lambda m, args: (args[0].tanh(),))
    model.lin.register_forward_hook(lambda m, args, out: out.sigmoid())
    compiled = ember.compiler.compile(model, backend="eager")
    torch.testing.assert_close(compiled(X), model(X))
    assert compiled.stats.breaks == [] and compiled.stats.failures == []


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_hooked_modules_under_aot_backends(backend):
    model = Net()
    model.register_forward_pre_hook(lambda m, args: (args[0].tanh(),))
    model.register_forward_hook(lambda m, args, out: out.sigmoid())
    compiled = ember.compiler.compile(lambda x: model(x), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(X), model(X))
