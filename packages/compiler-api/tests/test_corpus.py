"""A corpus of small functions, one per Python feature the translator supports.

Each runs compiled and eagerly on the same inputs; the outputs must match and
the function must be captured as exactly one graph with no fallback.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ember.compiler
from ember.compiler.testing import CompileCounter, assert_same

CORPUS: list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]]]] = []
SCALE = 3.0
TABLE = {"a": 1.5, "b": -2.0}
LAYER = torch.nn.Linear(4, 4)


def case(*make_args: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` with a maker of its arguments (fresh each call)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        CORPUS.append((fn.__name__, fn, lambda: tuple(m() for m in make_args)))
        return fn

    return register


def t(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def const(v: Any) -> Callable[[], Any]:
    return lambda: v


# -- loads, stores, constants ------------------------------------------------------------------
@case(t(4))
def fast_locals(x):
    y = x + 1
    z = y * 2
    return z - y


@case(t(4))
def global_constant(x):
    return x * SCALE


@case(t(4))
def global_dict_item(x):
    return x * TABLE["a"] + TABLE["b"]


@case(t(2, 4))
def global_module(x):
    return LAYER(x)


@case(t(4))
def closure_over_constant(x):
    k = 2.5

    def inner(v):
        return v * k

    return inner(x)


@case(t(4))
def nested_closures(x):
    a = 1.0

    def outer(v):
        b = 2.0

        def inner(w):
            return w * a + b

        return inner(v)

    return outer(x)


@case(t(4))
def closure_cell_reassigned_inside(x):
    total = x

    def add(v):
        return total + v

    total = total * 2
    return add(x)


@case(t(4), const(3))
def int_argument(x, n):
    return x * n + n


@case(t(4))
def default_arguments(x, scale=2.0, shift=-1):
    return x * scale + shift


@case(t(4))
def keyword_only_arguments(x, *, alpha=0.5):
    return x * alpha


@case(t(4), t(4), t(4))
def star_args(*xs):
    return sum(xs[1:], xs[0])


@case(t(4))
def star_kwargs(x, **opts):
    return x * opts.get("scale", 4.0)


def _helper_kw(x, *, power=2, bias=0.0):
    return x**power + bias


@case(t(4))
def call_with_keywords(x):
    return _helper_kw(x, power=3, bias=1.0)


@case(t(4))
def call_with_star_forwarding(x):
    args = (x,)
    kwargs = {"power": 2}
    return _helper_kw(*args, **kwargs)


@case(t(4))
def lambda_inline(x):
    f = lambda v: v.relu() + 1  # noqa: E731
    return f(x)


# -- operators ---------------------------------------------------------------------------------
@case(t(4), t(4))
def arithmetic(x, y):
    return (x + y) * (x - y) / (y.abs() + 1) - x**2 + (x // 1) + x % 2


@case(t(4, 4), t(4, 4))
def matmul_operator(x, y):
    return x @ y


@case(t(4))
def inplace_ops(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    return y


@case(t(4))
def inplace_method(x):
    y = x.clone()
    y.add_(1).mul_(3)
    return y


@case(t(4))
def unary_ops(x):
    return -x + (+x) + abs(x)


@case(t(4))
def bitwise_on_bools(x):
    a, b = x > 0, x < 0.5
    return (a & b) | (~a ^ b)


@case(t(4))
def comparisons(x):
    return (x > 0).float() + (x <= 0.5).float() + (x == x).float()


@case(t(4))
def chained_constant_comparison(x):
    n = 3
    return x * 2 if 0 < n < 5 else x


@case(t(4))
def python_arithmetic_on_constants(x):
    k = (7 // 2) * 3 % 5 + 2**3 - abs(-1)
    return x * k


@case(t(4))
def math_on_constants(x):
    return x * math.sqrt(2.0) + math.pi * math.cos(0.0)


@case(t(4))
def operator_module(x):
    return operator.add(operator.mul(x, 2), 1)


# -- control flow on trace-time values -------------------------------------------------------------
@case(t(4), const(True))
def if_on_bool_argument(x, flag):
    if flag:
        return x + 1
    return x - 1


@case(t(2, 3))
def if_on_shape(x):
    if x.shape[0] > 1 and x.dim() == 2:
        return x.sum(0)
    return x


@case(t(4), const(None))
def is_none_check(x, mask):
    if mask is None:
        mask = torch.ones_like(x)
    return x * mask


@case(t(4))
def while_loop_constant(x):
    i = 0
    while i < 3:
        x = x * 2
        i += 1
    return x


@case(t(4))
def for_range(x):
    for i in range(4):
        x = x + i
    return x


@case(t(4))
def for_break_continue(x):
    for i in range(10):
        if i % 2:
            continue
        if i > 6:
            break
        x = x * 1.5
    return x


@case(t(4))
def ternary(x):
    k = 2 if x.dim() == 1 else 3
    return x * k


@case(t(4))
def assert_on_shape(x):
    assert x.dim() == 1, "expects a vector"
    return x + 1


@case(t(4))
def boolean_short_circuit(x):
    scale = None
    return x * (scale or 2.0) * (1 and 3)


# -- containers ----------------------------------------------------------------------------------
@case(t(4), t(4))
def tuple_return(x, y):
    return x + y, x - y


@case(t(4))
def nested_return(x):
    return {"out": [x + 1, (x * 2, 3)], "n": "label"}


@case(t(4))
def list_building(x):
    out = []
    for i in range(3):
        out.append(x * i)
    out.extend([x, x])
    return torch.stack(out)


@case(t(4))
def list_comprehension(x):
    return torch.stack([x * i for i in range(3)])


@case(t(4))
def dict_comprehension(x):
    d = {f"k{i}": x + i for i in range(3)}
    return d["k0"] + d["k2"]


@case(t(4))
def generator_expression(x):
    return sum(x * i for i in range(4))


@case(t(4))
def dict_iteration(x):
    weights = {"a": 1.0, "b": 2.0}
    total = x * 0
    for key, value in weights.items():
        total = total + x * value
    return total


@case(t(4))
def unpacking(x):
    a, b, *rest = (x, x * 2, x * 3, x * 4)
    return a + b + sum(rest)


@case(t(4))
def tuple_concat_and_repeat(x):
    parts = (x,) + (x * 2,)
    return torch.cat(parts * 2)


@case(t(4))
def list_slicing_and_indexing(x):
    xs = [x, x + 1, x + 2, x + 3]
    return xs[-1] + sum(xs[1:3])


@case(t(4))
def enumerate_zip(x):
    out = x * 0
    for i, (a, b) in enumerate(zip([1.0, 2.0], [3.0, 4.0])):
        out = out + x * a * b + i
    return out


@case(t(4))
def reversed_sorted_minmax(x):
    ks = sorted([3, 1, 2])
    for k in reversed(ks):
        x = x + k
    return x * max(ks) - min(ks)


@case(t(4))
def any_all_len(x):
    flags = [True, False]
    return x * len(flags) + (1 if any(flags) else 0) + (1 if all(flags) else 0)


@case(t(4))
def isinstance_checks(x):
    n = 2
    if isinstance(x, torch.Tensor) and isinstance(n, (int, float)):
        return x * n
    return x


@case(t(4))
def getattr_hasattr(x):
    if hasattr(x, "shape") and getattr(x, "ndim", 0) == 1:
        return x + 1
    return x


@case(t(4))
def fstring_and_format(x):
    name = f"layer{2}_{'a'}"
    return x * len(name) + len("{}-{}".format(1, 2))


# -- tensors -------------------------------------------------------------------------------------
@case(t(3, 4))
def tensor_metadata(x):
    return x.reshape(x.size(0) * x.shape[1]) * x.dim() + x.ndim + x.numel()


@case(t(3, 4))
def tensor_indexing(x):
    return x[0] + x[1, 2] + x[:, 1].sum() + x[..., -1].sum() + x[None, 0].sum()


@case(t(3, 4))
def tensor_slicing_steps(x):
    return x[::2, 1:3].sum(1)


@case(t(5))
def boolean_mask_indexing_setitem(x):
    y = x.clone()
    y[y < 0] = 0.0
    return y


@case(t(3, 4))
def tensor_index_with_tensor(x):
    idx = torch.tensor([0, 2])
    return x[idx]


@case(t(3, 4))
def tensor_setitem_slice(x):
    y = x.clone()
    y[:, 0] = 1.0
    return y


@case(t(3, 4))
def tensor_methods(x):
    return x.transpose(0, 1).contiguous().view(-1).softmax(0).sum(-1, keepdim=True)


@case(t(3, 4))
def tensor_properties(x):
    return x.T @ x + x.mT.sum() + x.float().sum()


@case(t(4))
def dtype_and_device(x):
    y = x.to(dtype=torch.float64, device=x.device)
    return y.to(x.dtype) + torch.zeros(4, dtype=x.dtype)


@case(t(2, 4))
def torch_functions(x):
    return torch.where(x > 0, torch.exp(x), torch.zeros_like(x)).clamp(max=2.0)


@case(t(2, 4))
def functional_api(x):
    return F.gelu(F.layer_norm(x, (4,))) + F.softmax(x, -1)


@case(t(2, 4))
def tensor_creation(x):
    return x + torch.arange(4) + torch.ones(2, 4) * torch.full((1, 4), 0.5)


@case(t(2, 4))
def split_and_chunk(x):
    a, b = x.chunk(2, dim=1)
    c, d = torch.split(x, 1, dim=0)
    return a.sum() + b.sum() + c.sum() * d.sum()


@case(t(2, 4))
def iterate_tensor(x):
    return sum(row * i for i, row in enumerate(x))


@case(t(4))
def float_int_on_constants(x):
    return x * float(2) + int(3.7)


def _recursive(x, n):
    return x if n == 0 else _recursive(x * 2, n - 1)


@case(t(4))
def bounded_recursion(x):
    return _recursive(x, 3)


class Point:
    def __init__(self, a: float) -> None:
        self.a = a

    def scale(self, x):
        return x * self.a


POINT = Point(1.5)


@case(t(4))
def user_object_method(x):
    return POINT.scale(x) + POINT.a


class Doubled(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


DOUBLED = Doubled(4, 4)


@case(t(2, 4))
def super_forward(x):
    return DOUBLED(x)


class Config:
    factor = 3.0

    @classmethod
    def scale(cls, x):
        return x * cls.factor

    @staticmethod
    def shift(x):
        return x + 1


@case(t(4))
def classmethod_and_staticmethod(x):
    return Config.scale(Config.shift(x))


@case(t(4))
def functools_partial(x):
    import functools

    add_twice = functools.partial(torch.add, alpha=2)
    return add_twice(x, x)


@case(t(4))
def map_and_filter(x):
    doubled = list(map(lambda v: v * 2, [x, x + 1]))
    kept = list(filter(lambda k: k > 1, [0, 1, 2, 3]))
    return doubled[0] + doubled[1] * len(kept)


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 60, len(CORPUS)


@pytest.mark.parametrize(("name", "fn", "make"), CORPUS, ids=[c[0] for c in CORPUS])
def test_matches_eager_in_one_graph(name, fn, make):
    args = make()
    counter = CompileCounter()
    compiled = ember.compiler.compile(fn, backend=counter)
    torch.manual_seed(0)
    got = compiled(*args)
    torch.manual_seed(0)
    want = fn(*args)
    assert_same(got, want)
    assert compiled.stats.failures == [], compiled.stats.failures
    assert counter.frame_count == 1
    again = compiled(*args)  # served from the cache
    assert_same(again, want)
    assert counter.frame_count == 1
