"""Python floats the frame is given are graph inputs, not constants baked into the graph.

A float argument (a learning rate, a value ``.item()`` hands to a resume function)
becomes a placeholder guarded on its type only, so a new value reuses the graph.
Arithmetic on it stays in the graph; a branch on it guards the condition; anything
that needs the number itself (a size, a library call) specializes it with a guard.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

import ember.compiler
from ember.compiler.testing import CompileCounter


def _guards(fn, *args):
    explained = ember.compiler.explain(fn)(*args)
    return "\n".join(str(g) for g in explained.guards)


def scaled(x, lr):
    return x * lr + math.sqrt(lr)


def test_a_float_argument_is_a_graph_input_so_new_values_reuse_the_graph():
    counter = CompileCounter()
    compiled = ember.compiler.compile(scaled, backend=counter)
    x = torch.randn(4)
    for lr in (0.1, 0.25, 3.0, 1e-4):
        torch.testing.assert_close(compiled(x, lr), scaled(x, lr))
    assert counter.frame_count == 1
    guards = _guards(scaled, x, 0.1)
    assert "type(lr) is float" in guards and "lr ==" not in guards


def branches(x, lr):
    if lr > 0.5:
        return x * lr
    return x - lr


def test_a_branch_on_a_float_guards_the_condition_not_the_value():
    counter = CompileCounter()
    compiled = ember.compiler.compile(branches, backend=counter)
    x = torch.randn(4)
    for lr in (0.1, 0.2, 0.7, 0.9, 0.3):
        torch.testing.assert_close(compiled(x, lr), branches(x, lr))
    assert counter.frame_count == 2  # one graph per outcome
    assert "gt(lr, 0.5) == False" in _guards(branches, x, 0.1)


def spread(x, scales):
    return x / (1.0 + max(scales) - min(scales))


def test_floats_in_a_list_argument_are_graph_inputs():
    counter = CompileCounter()
    compiled = ember.compiler.compile(spread, backend=counter)
    x = torch.randn(4)
    for scales in ([1.0, 2.0, 0.5], [3.0, 3.0, 3.0], [0.0, -1.0, 9.0]):
        torch.testing.assert_close(compiled(x, scales), spread(x, scales))
    assert counter.frame_count == 1
    assert counter.op_count == 5  # max, add, min, sub, truediv: all in the graph


def sized(x, n):
    return x + torch.arange(0.0, n)


def rounded(x, s):
    return x.sum() * torch.ones(int(s))


def library(x, values):
    return x * statistics.fmean(values)


def test_a_float_whose_value_decides_a_shape_is_specialized():
    x = torch.randn(3)
    for fn, values in [(sized, (3.0, 2.5)), (rounded, (3.2, 4.9))]:
        counter = CompileCounter()
        compiled = ember.compiler.compile(fn, backend=counter)
        for value in values:
            torch.testing.assert_close(compiled(x, value), fn(x, value))
        assert counter.frame_count == len(values), fn.__name__  # guarded by value


def test_a_library_call_on_floats_runs_natively_and_its_result_is_a_graph_input():
    counter = CompileCounter()
    compiled = ember.compiler.compile(library, backend=counter)
    x = torch.randn(3)
    for values in ([1.0, 2.0], [2.0, 4.0], [1.0, 2.0]):
        torch.testing.assert_close(compiled(x, values), library(x, values))
    assert counter.frame_count == 1  # the resumed `x * mean`, whatever the mean


def test_int_of_a_float_is_guarded_by_its_result_only():
    counter = CompileCounter()
    compiled = ember.compiler.compile(rounded, backend=counter)
    x = torch.randn(3)
    for s in (3.2, 3.9, 3.5):  # int(s) == 3 each time: one graph
        torch.testing.assert_close(compiled(x, s), rounded(x, s))
    assert counter.frame_count == 1
    torch.testing.assert_close(compiled(x, 3.0), rounded(x, 3.0))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.5
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_float_attributes_of_modules_stay_constants():
    model = Scaled()
    counter = CompileCounter()
    compiled = ember.compiler.compile(model, backend=counter)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    model.scale = 2.0
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 2  # a changed attribute recompiles (guarded by value)


def training_step(model, opt, x, y):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    value = loss.item()  # a break: the resume function receives a float
    return loss.detach() * 0 + value * 2.0


def test_item_in_a_training_loop_compiles_once_not_every_step():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    reference = nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    counter = CompileCounter()
    compiled = ember.compiler.compile(training_step, backend=counter)
    for _ in range(5):
        torch.testing.assert_close(
            compiled(model, opt, x, y), training_step(reference, ref_opt, x, y)
        )
    first = counter.frame_count
    for _ in range(3):
        compiled(model, opt, x, y)
        training_step(reference, ref_opt, x, y)
    assert counter.frame_count == first  # the loss changes every step; nothing recompiles
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def formats(x):
    v = x.max().item()
    label = f"{v:.2f}"
    return x * 2, label


def test_formatting_a_float_specializes_it():
    # A string made from the number is guarded by value wherever it goes (as in Dynamo),
    # so each new value compiles the resumed code again, up to the cache limit.
    counter = CompileCounter()
    compiled = ember.compiler.compile(formats, backend=counter)
    x = torch.randn(4)
    for scale in (1.0, 1.0, 2.0):
        out, label = compiled(x * scale)
        torch.testing.assert_close(out, x * scale * 2)
        assert label == f"{(x * scale).max().item():.2f}"
    assert counter.frame_count == 3  # the graph before item(), then one per value
