"""Golden text (STYLE rule 14): the graphs, guards and generated code of a few frames.

A change to the translator that alters any of them shows up here as a diff to review.
Regenerate with ``EXPECTTEST_ACCEPT=1 python -m pytest packages/capture/tests/test_golden.py``.
"""

from __future__ import annotations

import os
import re

import expecttest
import torch

from ember.capture import hook
from ember.capture.frame_compiler import FrameCompiler, Stats


def _compile_once(fn, *args, **kwargs) -> Stats:
    compiler = FrameCompiler(lambda gm, example: gm.forward, "eager", entry_codes=(fn.__code__,))
    with hook.intercepting(compiler):
        fn(*args, **kwargs)
    return compiler.stats


def _text(stats: Stats) -> str:
    """Every compiled frame: its name, graph, guards and replacement, paths made local."""
    parts = []
    for c in stats.compiled:
        parts += [f"== {c.code}", c.graph.code.strip(), str(c.guards), c.replacement_source.strip()]
    text = "\n".join(parts)
    text = text.replace(os.path.abspath(__file__), "test_golden.py")
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


def step(x, lr, *, bias=None):
    y = torch.relu(x) * lr
    if bias is not None:
        y = y + bias
    print("step")
    return y.sum(), y


class Counter:
    def __init__(self) -> None:
        self.calls = 0


def records(x, log, counter):
    counter.calls += 1
    log.append(x.mean())
    return {"out": x * 2, "n": len(log)}


class TestGolden(expecttest.TestCase):
    def test_side_effects_are_replayed_after_the_graph(self) -> None:
        text = _text(_compile_once(records, torch.ones(2), [], Counter()))
        self.assertExpectedInline(
            text,
            """\
== records (test_golden.py:49)
def forward(self, x):
    mean = x.mean()
    mul = x * 2;  x = None
    return (mul, mean)
GuardSet of 14 guards:
  BACKEND       backend == 'eager'
  GLOBAL_STATE  grad mode == enabled
  GLOBAL_STATE  inference mode == disabled
  GLOBAL_STATE  autocast == disabled
  GLOBAL_STATE  default dtype == torch.float32
  GLOBAL_STATE  deterministic algorithms == disabled
  GLOBAL_STATE  torch function == enabled, no modes
  GLOBAL_STATE  global module hooks == no global module hooks
  TYPE_MATCH    type(counter) is Counter  # test_golden.py:50
  TYPE_MATCH    type(log) is list  # test_golden.py:51
  ID_MATCH      G['len'] is the builtin_function_or_method len  # test_golden.py:52
  LENGTH        len(log) == 0  # test_golden.py:51
  EQUALS        counter.calls == 0  # test_golden.py:50
  TENSOR_MATCH  x: Tensor(torch.float32, cpu, size=(2,), stride=(1,))  # test_golden.py:51
def __ember_make():
    def __ember_fn(__ember_a0, __ember_a1, __ember_a2, __ember_compiled, __ember_unhooked, __ember_G, __ember_c, __ember_B):
        __ember_o = __ember_unhooked(__ember_compiled, __ember_a0)
        __ember_t0 = __ember_a2; __ember_v0 = 1
        __ember_t1 = __ember_a1; __ember_v1 = [__ember_o[1]]
        __ember_r = (__ember_h1 := {'out': __ember_o[0], 'n': 1})
        __ember_B.setattr(__ember_t0, 'calls', __ember_v0)
        __ember_t1[:] = __ember_v1
        return __ember_r
    return __ember_fn""",
        )

    def test_a_break_its_graphs_guards_and_generated_code(self) -> None:
        self.assertExpectedInline(
            _text(_compile_once(step, torch.ones(3), 0.5)),
            """\
== step (test_golden.py:36)
def forward(self, x, lr):
    relu = torch.relu(x);  x = None
    mul = relu * lr;  relu = lr = None
    return (mul,)
GuardSet of 13 guards:
  BACKEND       backend == 'eager'
  GLOBAL_STATE  grad mode == enabled
  GLOBAL_STATE  inference mode == disabled
  GLOBAL_STATE  autocast == disabled
  GLOBAL_STATE  default dtype == torch.float32
  GLOBAL_STATE  deterministic algorithms == disabled
  GLOBAL_STATE  torch function == enabled, no modes
  GLOBAL_STATE  global module hooks == no global module hooks
  EQUALS        bias == None  # test_golden.py:38
  TYPE_MATCH    type(lr) is float  # test_golden.py:37
  ID_MATCH      G['print'] is the builtin_function_or_method print  # test_golden.py:40
  ID_MATCH      G['torch'].relu is the builtin_function_or_method _VariableFunctionsClass.relu  # test_golden.py:37
  TENSOR_MATCH  x: Tensor(torch.float32, cpu, size=(3,), stride=(1,))  # test_golden.py:37
graph break at File "test_golden.py", line 40, in step
== step.<resume at 90> (test_golden.py:36)
def forward(self, y):
    sum_1 = y.sum();  y = None
    return (sum_1,)
GuardSet of 10 guards:
  BACKEND       backend == 'eager'
  GLOBAL_STATE  grad mode == enabled
  GLOBAL_STATE  inference mode == disabled
  GLOBAL_STATE  autocast == disabled
  GLOBAL_STATE  default dtype == torch.float32
  GLOBAL_STATE  deterministic algorithms == disabled
  GLOBAL_STATE  torch function == enabled, no modes
  GLOBAL_STATE  global module hooks == no global module hooks
  EQUALS        __ember_s0 == None  # test_golden.py:36
  TENSOR_MATCH  y: Tensor(torch.float32, cpu, size=(3,), stride=(1,))  # test_golden.py:41
def __ember_make():
    def __ember_fn(__ember_a0, __ember_a1, __ember_a2, __ember_a3, __ember_a4, __ember_compiled, __ember_unhooked, __ember_G, __ember_c, __ember_B):
        __ember_o = __ember_unhooked(__ember_compiled, __ember_a3)
        return (__ember_o[0], __ember_a3)
    return __ember_fn""",
        )
