"""A corpus of small functions around graph breaks, side effects and Python features.

Each case is a function, makers of fresh inputs, and the ``(graphs, breaks)`` that a
good PyTorch-2-style compiler (TorchDynamo's design) produces for ONE call:

* ``graphs``: graphs handed to the backend (``CompileCounter.frame_count``). A graph
  with no tensor operation is not handed over; a frame with none is not compiled.
* ``breaks``: graph breaks taken (``len(stats.breaks)``). At an instruction the
  translator cannot follow (print, ``.item()``, a branch on a tensor, a call to a C
  function it does not know, ``graph_break()``, a ``raise``), the graph so far runs,
  the instruction runs natively, and a resume function goes on as a frame of its own.
  A break inside an inlined call happens at the outermost call site; the callee
  then runs as its own frame and may break in turn. A resume function served from
  the cache (the next turn of a loop with the same guarded state) adds nothing.
  Resume functions are made from the original code, so a loop that breaks at the
  same place turn after turn reuses one resume function (Dynamo's
  ``ContinueExecutionCache``); a break inside a ``for`` loop resumes inside the loop
  (classic Dynamo gives up on the frame there; the finer split is the expectation).
* ``try`` blocks cannot be resumed into: a break inside one runs the frame eagerly
  (no graph, no break, a failure). ``with torch.no_grad()`` can be re-entered, so
  a break inside it is an ordinary break.

Every case must give eager's result: the return value, the exception (type and
message), the arguments after the call (in-place ops, mutated lists, objects) and
the global state it touches. A case where ember gives a wrong result is marked
``WRONG RESULT``; one where only the counts differ is marked ``counts``.

PYTEST_DONT_REWRITE: the corpus's ``assert`` statements must stay plain Python (pytest's
rewriting gives them locals named ``@py_assert1``; ``local_named_by_pytest_rewrite``
covers that).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import math
import operator
import os
import random
import struct
import time
import types
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

import ember.compiler
from ember.compiler import graph_break
from ember.compiler.testing import CompileCounter


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    makers: tuple[Callable[[], Any], ...]
    kw: dict[str, Callable[[], Any]]
    graphs: int
    breaks: int
    setup: Callable[[], None] | None = None
    effects: Callable[[], Any] | None = None

    def make(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(m() for m in self.makers), {k: m() for k, m in self.kw.items()}


CASES: list[Case] = []


def case(
    graphs: int,
    breaks: int,
    *makers: Callable[[], Any],
    kw: dict[str, Callable[[], Any]] | None = None,
    setup: Callable[[], None] | None = None,
    effects: Callable[[], Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn``: expected counts for one call, makers of its (fresh) arguments."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        CASES.append(Case(fn.__name__, fn, makers, kw or {}, graphs, breaks, setup, effects))
        return fn

    return register


def t(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def ones(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.ones(*shape)


def tensor(*values: float) -> Callable[[], torch.Tensor]:
    return lambda: torch.tensor(values)


def const(v: Any) -> Callable[[], Any]:
    return lambda: copy.deepcopy(v)


def cell(fn: Callable[..., Any], name: str) -> Any:
    """The closure cell of ``fn`` named ``name`` (its contents can be read and reset)."""
    return fn.__closure__[fn.__code__.co_freevars.index(name)]  # type: ignore[index]


# -- shared helpers, classes and global state ------------------------------------------------------
COUNTER = 0
LAST: Any = None
BUF = torch.zeros(4)
WEIGHTS = {"a": 2.0, "b": 3.0}
LOG: list[Any] = []


def reset_globals() -> None:
    global COUNTER, LAST, BUF
    COUNTER, LAST, BUF = 0, None, torch.zeros(4)
    LOG.clear()


def globals_now() -> Any:
    return {"COUNTER": COUNTER, "LAST": LAST, "BUF": BUF.clone(), "LOG": list(LOG)}


def helper_that_prints(x):
    y = x * 3
    print("inside helper")
    return y + 1


def helper_that_breaks(x):
    y = x * 2
    graph_break()
    return y + 1


class Point:
    def __init__(self, a: float) -> None:
        self.a = a

    def scale(self, x):
        return x * self.a


class Scaler:
    FACTOR = 3.0
    count = 0

    def __init__(self, k: float) -> None:
        self.k = k
        self.history: list[Any] = []

    @property
    def double(self) -> float:
        return self.k * 2

    @staticmethod
    def shift(x):
        return x + 1

    @classmethod
    def by_factor(cls, x):
        return x * cls.FACTOR

    def noisy(self, x):
        y = x * self.k
        print("noisy", self.k)
        return y

    def __call__(self, x):
        return x * self.k - 1


class Base:
    def f(self, x):
        return x + 1


class Child(Base):
    def f(self, x):
        return super().f(x) * 2


class NoisyChild(Base):
    def f(self, x):
        y = super().f(x)
        print("noisy child")
        return y * 2


CHILD = Child()
NOISY_CHILD = NoisyChild()


class Holder:
    def __init__(self) -> None:
        self.count = 0
        self.w = torch.ones(4)

    @property
    def w2(self):
        return self.w * 2


class Registry:
    count = 0


class Pair(NamedTuple):
    a: Any
    b: Any


Triple = collections.namedtuple("Triple", "x y z")


@dataclasses.dataclass
class Cfg:
    scale: float
    bias: float = 0.0


@dataclasses.dataclass
class State:
    total: Any
    steps: int = 0


class MyError(Exception):
    pass


class Counted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


class NoisyModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        print("noisy module")
        return h.relu()


# == print =========================================================================================
@case(2, 1, t(4))
def print_between_ops(x):
    y = x.sin()
    print("between")
    return y.cos()


@case(1, 1, t(4))
def print_first(x):
    print("first")
    return x * 2


@case(1, 1, t(4))
def print_last(x):
    y = x * 2
    print("last")
    return y


@case(0, 1, const(3))
def print_without_tensor_ops(n):
    print("n is", n)
    return n + 1


@case(3, 2, t(10), t(10))
def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


@case(2, 1, t(4))
def print_with_keywords(x):
    y = x + 1
    print("a", 1, sep="-", end="!\n")
    return y * 2


@case(2, 1, t(2, 3))
def print_shape(x):
    y = x.t()
    print(y.shape)
    return y.sum(0)


@case(2, 1, t(4))
def print_tensor(x):
    y = x.exp()
    print(y)
    return y.log()


@case(2, 1, t(4))
def print_result_used(x):
    y = x + 1
    r = print("r")
    return y * 2 if r is None else y


@case(1, 1, t(4), const(True))
def print_in_static_branch(x, flag):
    if flag:
        print("yes")
    else:
        print("no")
    return x - 1


# == .item() =======================================================================================
@case(2, 1, t(4))
def item_scale(x):
    return x * x.sum().item()


@case(2, 1, t(4))
def item_python_arithmetic(x):
    s = x.mean().item()
    return x + s * 2 + 1


@case(1, 1, t(4))
def item_returned(x):
    return x.max().item()


@case(2, 1, ones(4))
def item_branch(x):
    if x.sum().item() > 0:
        return x + 1
    return x - 1


@case(2, 1, t(5))
def item_as_index(x):
    k = int(x.argmax().item())
    return x[k] * 2


@case(3, 2, t(4))
def item_twice(x):
    a = x.sum().item()
    b = x.max().item()
    return x * a + b


@case(2, 1, t(4))
def float_of_tensor(x):
    return x * float(x.sum())


# == .tolist() =====================================================================================
@case(1, 1, t(4))
def tolist_returned(x):
    return (x * 2).tolist()


@case(1, 1, t(4))
def tolist_of_input(x):
    vals = x.tolist()
    return x * sum(vals)


@case(2, 1, t(3))
def tolist_iterated(x):
    vals = (x + 1).tolist()
    out = x
    for v in vals:
        out = out + v
    return out


@case(2, 1, t(4))
def tolist_len(x):
    n = len(x.round().tolist())
    return x * n


@case(1, 1, t(2, 3))
def tolist_back_to_tensor(x):
    rows = x.tolist()
    return torch.tensor(rows) + x


# == branching on a tensor =========================================================================
@case(2, 1, ones(4))
def if_sum_positive(x):
    if x.sum() > 0:
        return x * 2
    return x * 3


@case(2, 1, ones(4))
def if_all(x):
    if (x > 0).all():
        x = x + 1
    return x * 2


@case(3, 2, lambda: torch.full((3,), 2.0))
def if_elif_else(x):
    if x.mean() > 10:
        y = x
    elif x.mean() > -10:
        y = x * 2
    else:
        y = -x
    return y + 1


@case(3, 2, ones(3))
def if_and_of_tensors(x):
    if x.sum() > 0 and x.max() > 100:
        return x + 1
    return x - 1


@case(2, 1, ones(3))
def ternary_on_tensor(x):
    y = x * 2 if x.sum() > 0 else x * 3
    return y + 1


@case(2, 1, ones(3))
def if_not_tensor(x):
    if not x.any():
        return x
    return x - 1


def _pick(x):
    if x.sum() > 0:
        return x
    return -x


@case(3, 2, ones(3))
def if_tensor_in_helper(x):
    y = x + 1
    return _pick(y) * 2


@case(2, 1, ones(3))
def bool_of_tensor(x):
    flag = bool(x.sum() > 1)
    return x * 2 if flag else x


# == while on a tensor =============================================================================
@case(2, 2, tensor(5.0, -3.0))
def while_halving(x):
    while x.abs().max() > 1:
        x = x / 2
    return x


@case(2, 1, lambda: torch.zeros(3))
def while_zero_turns(x):
    while x.sum() > 0:
        x = x - 1
    return x + 1


@case(3, 2, ones(1))
def while_one_turn(x):
    while x.sum() > 0:
        x = x - 1
    return x * 2


@case(3, 3, tensor(2.0))
def while_with_counter(x):
    n = 0
    while x.sum() > 0:
        x = x - 1
        n += 1
    return x, n


@case(2, 2, ones(2))
def while_true_break_on_tensor(x):
    while True:
        x = x * 2
        if x.sum() > 10:
            break
    return x


# == graph_break() =================================================================================
@case(2, 1, t(4))
def graph_break_middle(x):
    y = x.sin()
    graph_break()
    return y.cos()


@case(1, 1, t(4))
def graph_break_first(x):
    graph_break()
    return x + 1


@case(1, 1, t(4))
def graph_break_last(x):
    y = x + 1
    graph_break()
    return y


@case(3, 2, t(4))
def graph_break_twice(x):
    x = x + 1
    graph_break()
    x = x * 2
    graph_break()
    return x - 3


@case(4, 2, t(4))
def graph_break_in_helper(x):
    return helper_that_breaks(x + 1) - 1


@case(0, 1, const(4))
def graph_break_without_tensor_ops(n):
    graph_break()
    return n * 2


@case(2, 2, t(4))
def graph_break_in_for(x):
    for _ in range(2):
        x = x + 1
        graph_break()
    return x


# == calls into C functions ember does not know ====================================================
@case(2, 2, t(4))
def perf_counter_elapsed(x):
    t0 = time.perf_counter()
    y = x.sin()
    dt = time.perf_counter() - t0
    return y * 2, dt >= 0


@case(2, 1, t(4))
def monotonic_between_ops(x):
    y = x.exp()
    _ = time.monotonic()
    return y.log()


@case(2, 1, t(4))
def sleep_zero(x):
    y = x + 1
    time.sleep(0)
    return y * 2


@case(1, 1, t(4))
def random_random(x):
    return x * random.random()


@case(1, 1, t(4))
def random_randint(x):
    k = random.randint(1, 6)
    return x * k


@case(1, 1, t(4))
def zlib_crc32(x):
    h = zlib.crc32(b"ember")
    return x + (h % 7)


@case(1, 2, t(4))
def struct_round_trip(x):
    (v,) = struct.unpack("<f", struct.pack("<f", 1.5))
    return x * v


@case(2, 1, t(4))
def getpid_positive(x):
    y = x + 1
    pid_ok = os.getpid() > 0
    return y * 2 if pid_ok else y


@case(1, 0, t(4))
def math_on_constants_folds(x):
    return x * math.floor(3.7) + math.gcd(12, 18)


# == breaks inside for loops =======================================================================
@case(4, 3, t(4))
def for_print_each_turn(x):
    for i in range(3):
        x = x * 2
        print("step", i)
        x = x + i
    return x


@case(2, 1, t(4))
def for_print_first_turn(x):
    for i in range(3):
        x = x + 1
        if i == 0:
            print("first")
    return x


@case(4, 3, t(3, 2))
def for_item_accumulate(x):
    total = 0.0
    for i in range(x.shape[0]):
        total += x[i].sum().item()
    return x * total


@case(3, 2, t(4))
def for_list_append_break(x):
    outs = []
    for k in (1.0, 2.0):
        outs.append(x * k)
        graph_break()
    return torch.stack(outs)


@case(2, 2, t(4))
def for_enumerate_print(x):
    for i, k in enumerate([2.0, 3.0]):
        x = x * k
        print(i)
    return x


@case(4, 4, t(4))
def for_nested_print(x):
    for i in range(2):
        for j in range(2):
            x = x + 1
            print(i, j)
    return x


@case(2, 2, t(4))
def for_zip_graph_break(x):
    for a, b in zip((1.0, 2.0), (3.0, 4.0), strict=True):
        x = x * a + b
        graph_break()
    return x


# == breaks inside while loops =====================================================================
@case(3, 3, t(4))
def while_counter_print(x):
    i = 0
    while i < 3:
        x = x + 1
        print(i)
        i += 1
    return x


# The item() value is a graph input of the resume function and the `< 1` a guard on it, so
# the resumed loop body is compiled once per outcome, not once per value (the exit has no
# ops, so no graph): 2 graphs, 2 breaks.
@case(2, 2, tensor(8.0, -4.0))
def while_item_converges(x):
    while True:
        x = x * 0.5
        if x.abs().max().item() < 1:
            break
    return x


@case(2, 2, t(4))
def while_graph_break_in_body(x):
    n = 0
    while n < 2:
        x = x.sin()
        graph_break()
        n += 1
    return x


@case(3, 3, ones(2))
def while_tensor_cond_and_print(x):
    while x.sum() < 4:
        x = x + 1
        print("step")
    return x


@case(3, 3, t(4))
def while_list_pop(x):
    items = [1.0, 2.0, 3.0]
    while items:
        x = x * items.pop()
        print(len(items))
    return x


# == breaks in nested calls ========================================================================
@case(4, 2, t(4))
def helper_prints(x):
    a = x.relu()
    b = helper_that_prints(a)
    return b - a


def _level_h(x):
    y = x.sin()
    print("in h")
    return y.cos()


def _level_g(x):
    return _level_h(x * 3) + 1


@case(6, 3, t(4))
def two_levels_of_calls(x):
    return _level_g(x + 1) * 2


@case(4, 3, t(4))
def helper_called_twice(x):
    a = helper_that_prints(x)
    b = helper_that_prints(x * 2)
    return a + b


def _scale_of(x):
    return x.abs().max().item()


@case(2, 2, t(4))
def helper_with_item(x):
    return x / _scale_of(x)


@case(2, 2, t(4), lambda: Scaler(2.0))
def method_that_prints(x, s):
    return s.noisy(x) + 1


def _log_shape(t):
    print("shape", tuple(t.shape))


@case(2, 2, t(4))
def helper_prints_without_tensor_ops(x):
    y = x + 1
    _log_shape(y)
    return y * 2


@case(2, 2, t(4))
def lambda_that_prints(x):
    g = lambda v: (print("lam"), v * 2)[1]  # noqa: E731
    return g(x) + 1


@case(4, 2, t(2, 4), lambda: NoisyModule())
def module_that_prints(x, mod):
    return mod(x * 2) + 1


# == closures ======================================================================================
def _make_scaled(scale):
    def closure_reads_freevar(x):
        y = x * scale
        print("scaled")
        return y + scale

    return closure_reads_freevar


case(2, 1, t(4))(_make_scaled(3.0))


def _make_matmul(w):
    def closure_over_tensor(x):
        h = x @ w
        graph_break()
        return h.relu()

    return closure_over_tensor


case(2, 1, t(2, 3))(_make_matmul(torch.randn(3, 3)))


@case(2, 1, t(4))
def makes_a_closure_and_breaks(x):
    k = 2.0

    def inner(v):
        return v * k

    y = inner(x)
    print("made a closure")
    return inner(y)


def _make_counting():
    calls = 0

    def nonlocal_counter_breaks(x):
        nonlocal calls
        calls += 1
        print("call", calls)
        return x * calls

    return nonlocal_counter_breaks


_counting = _make_counting()
case(
    1,
    1,
    t(4),
    setup=lambda: setattr(cell(_counting, "calls"), "cell_contents", 0),
    effects=lambda: cell(_counting, "calls").cell_contents,
)(_counting)


@case(2, 1, t(4))
def closure_appends_and_breaks(x):
    acc = []

    def add(v):
        acc.append(v)

    add(x + 1)
    graph_break()
    add(x * 2)
    return torch.stack(acc)


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        print("calling", fn.__name__)
        return fn(*args)

    return wrapper


@_logged
def decorated_and_prints(x):
    return x * 2


case(1, 1, t(4))(decorated_and_prints)


@case(2, 1, t(4))
def comprehension_over_local_and_break(x):
    ys = [x * i for i in range(3)]
    print("built")
    return torch.stack(ys)


# == keyword-only, *args, **kwargs, defaults =======================================================
@case(2, 1, t(4), kw={"shift": const(1.0)})
def kwonly_breaks(x, *, scale=2.0, shift):
    y = x * scale
    print("kwonly")
    return y + shift


@case(2, 1, t(4), t(4), t(4))
def star_args_breaks(*xs):
    s = sum(xs[1:], xs[0])
    graph_break()
    return s * len(xs)


@case(2, 1, t(4), kw={"a": const(2.0), "b": const(0.5)})
def star_kwargs_breaks(x, **opts):
    y = x * opts["a"]
    print(sorted(opts))
    return y + opts.get("b", 0)


@case(2, 1, t(4))
def defaults_break(x, k=3, bias=None):
    y = x * k
    print("defaults")
    if bias is None:
        bias = 0.5
    return y + bias


@case(2, 1, t(4), const(5.0), const(6.0), kw={"c": const(7.0), "e": const(8.0)})
def all_argument_kinds_break(a, b=2, *rest, c, d=4, **kw):
    y = a * b + sum(rest)
    graph_break()
    return y * c + d + kw["e"]


def _kw_helper(x, *, power=2, bias=0.0):
    y = x**power
    print("kw helper")
    return y + bias


@case(2, 2, t(4), kw={"power": const(3), "bias": const(1.0)})
def forwards_kwargs_to_breaking_helper(x, **kw):
    return _kw_helper(x, **kw)


# == user classes ==================================================================================
@case(2, 1, t(4), lambda: Point(1.5))
def method_then_print(x, p):
    y = p.scale(x)
    print("point", p.a)
    return y + p.a


@case(1, 0, t(4), lambda: Holder())
def attribute_writes_on_argument(x, h):
    h.count = h.count + 1
    h.last = x * 2
    return h.last + h.count


@case(2, 1, t(4), lambda: Holder())
def attribute_writes_around_break(x, h):
    h.before = 1
    y = x + 1
    print("between writes")
    h.after = h.before + 1
    return y * h.after


@case(1, 0, t(4), lambda: Scaler(1.5))
def property_read(x, s):
    return x * s.double


@case(1, 0, t(4), lambda: Holder())
def property_computes_tensor(x, h):
    return x + h.w2


@case(1, 0, t(4))
def staticmethod_and_classmethod(x):
    return Scaler.shift(x) + Scaler.by_factor(x)


@case(1, 0, t(4), lambda: Scaler(2.0))
def classmethod_through_instance(x, s):
    return s.by_factor(x) + s.shift(x) * s.k


@case(1, 0, t(4))
def super_call(x):
    return CHILD.f(x)


@case(2, 2, t(4))
def super_call_that_prints(x):
    return NOISY_CHILD.f(x)


@case(1, 0, t(4))
def instance_made_inside(x):
    p = Point(2.0)
    return p.scale(x) + p.a


@case(1, 0, t(4), lambda: Holder())
def setattr_getattr_builtins(x, h):
    setattr(h, "k", 3)  # noqa: B010
    return x * getattr(h, "k")  # noqa: B009


@case(1, 0, t(4), setup=lambda: setattr(Registry, "count", 0), effects=lambda: Registry.count)
def class_attribute_store(x):
    Registry.count += 1
    return x * Registry.count


@case(1, 0, t(4), lambda: Scaler(3.0))
def callable_instance(x, s):
    return s(x) * 2


@case(1, 0, t(4), lambda: Holder())
def hasattr_on_instance(x, h):
    if hasattr(h, "missing"):
        return x
    return x * h.w


@case(1, 0, t(4), lambda: Scaler(2.0))
def type_of_instance(x, s):
    return x * type(s).FACTOR + (1 if type(s) is Scaler else 0)


# == dataclasses and namedtuples ===================================================================
@case(1, 0, t(4))
def namedtuple_returned(x):
    return Pair(x + 1, x * 2)


@case(1, 0, lambda: Pair(torch.randn(4), torch.randn(4)))
def namedtuple_fields(p):
    return p.a * p.b + p[0]


@case(2, 1, t(4))
def namedtuple_and_break(x):
    p = Pair(x + 1, x - 1)
    print(p._fields)
    return p.a * p.b


@case(1, 0, t(4))
def collections_namedtuple(x):
    tr = Triple(x, x * 2, 3)
    a, b, c = tr
    return tr.y + a * c + b + len(tr._fields)


@case(1, 0, t(4), lambda: Cfg(2.0, 1.0))
def dataclass_argument(x, cfg):
    return x * cfg.scale + cfg.bias


@case(1, 0, t(4))
def dataclass_made_inside(x):
    c = Cfg(2.0, bias=1.0)
    return x * c.scale + c.bias


@case(1, 0, t(4), lambda: State(torch.zeros(())))
def dataclass_field_updates(x, st):
    st.total = st.total + x.sum()
    st.steps += 1
    return st.total * st.steps


@case(1, 0, t(4), lambda: Cfg(2.0, 3.0))
def dataclass_fields_loop(x, cfg):
    y = x + 1
    for fld in dataclasses.fields(cfg):
        y = y * getattr(cfg, fld.name)
    return y


@case(2, 1, t(4), lambda: Cfg(2.0, 1.0))
def dataclass_printed(x, cfg):
    y = x * cfg.scale
    print(cfg)
    return y + cfg.bias


# == comprehensions and generator expressions ======================================================
@case(1, 0, t(4))
def listcomp_with_condition(x):
    return torch.stack([x[i] * 2 for i in range(4) if i % 2 == 0])


@case(1, 0, t(4))
def dictcomp_over_global(x):
    d = {k: x * v for k, v in WEIGHTS.items()}
    return d["a"] + d["b"]


@case(1, 0, t(4))
def setcomp_of_constants(x):
    s = {i % 3 for i in range(10)}
    return x * len(s)


@case(1, 0, t(4))
def genexpr_sum(x):
    return sum(x[i] for i in range(3))


@case(1, 0, t(4))
def nested_listcomp(x):
    return [[x * i * j for j in range(2)] for i in range(2)]


@case(1, 0, t(4))
def genexpr_any_on_constants(x):
    if any(k > 2 for k in (1, 2, 3)):
        return x + 1
    return x


@case(3, 3, t(4))
def listcomp_that_prints(x):
    ys = [print(i) or x * i for i in range(2)]
    return torch.stack(ys)


# == generators consumed inside the frame ==========================================================
def _gen(x, n):
    for i in range(n):
        yield x * i


def _gen_logged(x, log):
    for i in range(3):
        log.append(i)
        yield x * i


def _gen_outer(x):
    yield from _gen(x, 2)
    yield x + 100


def _gen_prints(x):
    for i in range(2):
        print("yield", i)
        yield x * i


@case(1, 0, t(4))
def generator_to_list(x):
    return torch.stack(list(_gen(x, 3)))


@case(1, 0, t(4))
def generator_in_for(x):
    acc = x
    for v in _gen(x, 3):
        acc = acc + v
    return acc


@case(1, 0, t(4))
def generator_yield_from(x):
    return sum(_gen_outer(x))


@case(1, 0, t(4))
def generators_zipped(x):
    return sum(a * b for a, b in zip(_gen(x, 2), _gen(x, 2), strict=True))


@case(1, 0, t(4), const([]))
def generator_partly_consumed(x, log):
    g = _gen_logged(x, log)
    a = next(g)
    b = next(g)
    return a + b


@case(2, 1, t(4))
def generator_then_break(x):
    ys = list(_gen(x, 2))
    print(len(ys))
    return ys[0] + ys[1]


@case(1, 1, t(4))
def generator_that_prints(x):
    return torch.stack(list(_gen_prints(x)))


# == functools.partial =============================================================================
def _affine(a, x, b=0.0):
    return x * a + b


def _noisy_scale(k, x):
    y = x * k
    print("noisy scale")
    return y


SCALE_BY_2 = functools.partial(torch.mul, other=2)


@case(1, 0, t(4))
def partial_of_user_function(x):
    p = functools.partial(_affine, 3.0, b=1.0)
    return p(x)


@case(1, 0, t(4))
def partial_of_torch_function_global(x):
    return SCALE_BY_2(x) + 1


@case(1, 0, t(4), lambda: functools.partial(_affine, 2.0, b=1.0))
def partial_as_argument(x, fn):
    return fn(x) * 2


@case(1, 0, t(4))
def partial_of_partial(x):
    p = functools.partial(functools.partial(_affine, 2.0), b=3.0)
    return p(x)


@case(1, 0, t(2, 4))
def partial_of_functional(x):
    sm = functools.partial(F.softmax, dim=-1)
    return sm(x) * 2


@case(2, 2, t(4))
def partial_that_prints(x):
    p = functools.partial(_noisy_scale, 2.0)
    return p(x) + 1


# == operator ======================================================================================
@case(1, 0, t(4))
def operator_itemgetter(x):
    xs = [x, x + 1, x + 2]
    a, b = operator.itemgetter(0, 2)(xs)
    return a * b


@case(1, 0, t(2, 3))
def operator_attrgetter(x):
    shape = operator.attrgetter("shape")(x)
    return x.reshape(shape[1], shape[0]) * 2


@case(1, 0, t(2, 3))
def operator_methodcaller(x):
    return operator.methodcaller("sum", 0)(x) + 1


@case(1, 0, t(4))
def operator_reduce(x):
    return functools.reduce(operator.add, [x, x * 2, x * 3])


@case(1, 0, t(4))
def operator_inplace_and_setitem(x):
    y = operator.iadd(x.clone(), 1)
    d = {}
    operator.setitem(d, "k", y * 2)
    return d["k"]


@case(1, 0, t(4))
def operator_on_constants(x):
    k = operator.mul(3, 4) if operator.contains([1, 2], 2) else 0
    return x * k + operator.neg(1)


@case(1, 0, t(4))
def operator_on_tensors(x):
    return operator.lt(x, 0).float() + operator.truediv(x, 2)


# == builtins over static sequences ================================================================
@case(1, 0, t(4))
def enumerate_with_start(x):
    for i, k in enumerate((2.0, 3.0), start=1):
        x = x * k + i
    return x


@case(1, 0, t(4))
def reversed_list_of_tensors(x):
    acc = x * 0
    for v in reversed([x, x * 2, x * 3]):
        acc = acc * 0.5 + v
    return acc


@case(1, 0, t(4))
def sorted_with_key(x):
    words = sorted(["bbb", "a", "cc"], key=len)
    return x * len(words[-1]) + len(words[0])


@case(1, 0, t(4))
def sum_with_start(x):
    return x * sum([1, 2, 3], 10)


@case(1, 0, t(4))
def map_with_lambda(x):
    return torch.stack(list(map(lambda k: x * k, [1, 2])))


@case(1, 0, t(4))
def map_two_sequences(x):
    return sum(map(operator.mul, [x, x], [2.0, 3.0]))


@case(1, 0, t(4))
def filter_by_dim(x):
    kept = list(filter(lambda v: v.dim() == 1, [x, x.view(2, 2), x * 2]))
    return torch.stack(kept)


@case(1, 0, t(4))
def min_max_all(x):
    ks = [3, 1, 2]
    return x * max(ks) - min(ks) + (1 if all(k > 0 for k in ks) else 0)


@case(1, 1, t(4))
def sum_of_tensors_then_break(x):
    total = sum([x, x * 2])
    print("summed")
    return total


@case(2, 1, ones(3))
def any_over_tensors_breaks(x):
    if any(v.sum() > 0 for v in (x, -x)):
        return x + 1
    return x - 1


@case(1, 0, t(4))
def zip_dict_of_lists(x):
    names, scales = ["a", "b"], [2.0, 3.0]
    d = dict(zip(names, scales, strict=True))
    return x * d["b"] + len(d)


# == dict iteration ================================================================================
@case(1, 0, t(4))
def dict_keys_loop(x):
    for k in WEIGHTS:
        x = x + WEIGHTS[k]
    return x


@case(1, 0, t(4))
def dict_values_of_tensors(x):
    d = {"a": x, "b": x * 2}
    return sum(d.values())


@case(1, 0, t(4))
def dict_sorted_keys(x):
    d = {"z": 1.0, "a": 2.0}
    out = []
    for k in sorted(d):
        out.append(x * d[k])
    return torch.cat(out)


@case(1, 0, lambda: {"w": torch.randn(4), "b": torch.randn(4)})
def dict_argument_of_tensors(d):
    return d["w"] * 2 + d["b"]


@case(2, 2, t(4))
def dict_items_loop_prints(x):
    for k, v in WEIGHTS.items():
        x = x * v
        print(k)
    return x


@case(1, 0, t(4))
def dict_methods_on_local(x):
    d = {"a": x}
    d.update(b=x * 2)
    d.setdefault("c", x * 3)
    d.setdefault("a", x * 100)
    popped = d.pop("b")
    return d["a"] + d["c"] + popped + len(d)


@case(1, 0, t(4))
def dict_items_enumerate(x):
    total = x * 0
    for i, (k, v) in enumerate(sorted(WEIGHTS.items())):
        total = total + x * v * (i + 1) + len(k)
    return total


# == isinstance ====================================================================================
@case(1, 0, t(4), const(2))
def isinstance_tuple_of_types(x, n):
    if isinstance(n, (int, float)) and not isinstance(n, (bool, str)):
        return x * n
    return x


@case(1, 0, t(4))
def isinstance_abc_sequence(x):
    xs = [x, x + 1]
    if isinstance(xs, Sequence) and not isinstance(xs, Mapping):
        return xs[0] * xs[1]
    return x


@case(1, 0, lambda: {"a": torch.randn(4)})
def isinstance_abc_mapping(d):
    if isinstance(d, Mapping):
        return d["a"] + 1
    return d


@case(1, 0, t(4))
def isinstance_parameter(x):
    if isinstance(x, torch.nn.Parameter):
        return x
    return x * 2


@case(1, 0, t(4), lambda: Child())
def isinstance_user_hierarchy(x, obj):
    if isinstance(obj, (Base, str)):
        return obj.f(x)
    return x


@case(1, 0, t(4))
def isinstance_abc_callable_iterable(x):
    k = 0
    if isinstance(_affine, Callable):
        k += 1
    if isinstance((1, 2), Iterable):
        k += 2
    return x * k


@case(2, 1, t(4))
def isinstance_then_break(x):
    y = x + 1
    if isinstance(y, torch.Tensor):
        print("tensor")
    return y * 2


# == f-strings =====================================================================================
@case(1, 0, t(4), const(7))
def fstring_of_constants(x, k):
    name = f"{k:03d}-{'s'!r}"
    return x * len(name)


@case(1, 0, t(2, 3))
def fstring_of_shape(x):
    label = f"{tuple(x.shape)}"
    return x.sum() + len(label)


@case(2, 1, t(4))
def fstring_of_tensor(x):
    msg = f"{x.sum()}"
    return x + len(msg)


@case(2, 1, t(4))
def fstring_of_item(x):
    v = x.max().item()
    label = f"{v:.2f}"
    return x * 2, label


@case(1, 0, t(4), const(8), const(3))
def fstring_nested_spec(x, w, p):
    s = f"{math.pi:{w}.{p}f}"
    return x * len(s)


@case(2, 1, t(4))
def fstring_printed(x):
    y = x * 2
    print(f"shape={tuple(y.shape)} dtype={y.dtype}")
    return y + 1


# == tensor indexing ===============================================================================
@case(1, 0, t(3, 4))
def index_int_and_negative(x):
    return x[-1] + x[0, 1]


@case(1, 0, t(6))
def index_slice_steps(x):
    return x[1:-1:2] * 2 + x.flip(0)[::3].sum()


@case(1, 0, t(3, 4))
def index_none_and_ellipsis(x):
    return x[None, ..., 0] + x[..., None].sum()


@case(1, 0, t(5), lambda: torch.tensor([0, 3, 3]))
def index_with_long_tensor(x, idx):
    return x[idx] * 2


@case(2, 1, t(6))
def index_with_bool_mask(x):
    return x[x > 0].sum() * 2


@case(1, 0, t(6))
def setitem_with_bool_mask(x):
    y = x.clone()
    y[y < 0] = 0.0
    return y


@case(1, 0, t(4))
def setitem_slice_from_tensor(x):
    y = x.clone()
    y[1:3] = x[:2] * 2
    return y


@case(1, 0, t(4))
def index_with_list(x):
    return x[[0, 2]] + 1


@case(2, 1, t(5))
def index_from_item(x):
    i = x.argmax().item()
    return x[i] * 3


@case(1, 0, t(2, 3))
def chained_index_assignment(x):
    y = x.clone()
    y[0][1] = 5.0
    return y


@case(1, 0, t(4))
def index_with_zero_dim_tensor(x):
    return x[torch.tensor(1)] * 2


@case(2, 1, t(6))
def nonzero_breaks(x):
    idx = torch.nonzero(x > 0)
    return idx * 2


# == in-place tensor ops ===========================================================================
@case(1, 0, t(4))
def inplace_on_input(x):
    x.add_(1)
    return x * 2


@case(1, 0, t(3, 4))
def inplace_on_view_of_input(x):
    x[0].mul_(10)
    return x.sum()


@case(2, 1, t(4))
def inplace_around_break(x):
    x.mul_(2)
    print("mutated")
    x.add_(1)
    return x


@case(1, 0, t(4))
def inplace_chain_on_clone(x):
    y = x.clone()
    y.relu_().clamp_(max=0.5)
    return y


@case(1, 0, t(4), setup=reset_globals, effects=globals_now)
def inplace_on_global_buffer(x):
    BUF.add_(x)
    return BUF * 2


@case(1, 0, t(4), lambda: torch.empty(4))
def out_argument(x, out):
    torch.add(x, 1, out=out)
    return out * 2


@case(1, 0, t(4))
def masked_fill_inplace(x):
    y = x.clone()
    y.masked_fill_(y < 0, 0.0)
    return y


@case(1, 0, lambda: [torch.randn(4), torch.randn(4)])
def augassign_list_element(xs):
    xs[0] += 1
    return xs[0] * xs[1]


# == assert ========================================================================================
@case(1, 0, t(4))
def assert_shape_holds(x):
    assert x.dim() == 1, "expects a vector"
    return x + 1


@case(1, 0, t(4), const(3))
def assert_isinstance_holds(x, n):
    assert isinstance(n, int) and n > 0, f"bad n {n}"
    return x * n


@case(0, 1, t(4))
def assert_fails(x):
    assert x.dim() == 2, "need a matrix"
    return x


@case(1, 1, t(4))
def assert_fails_after_ops(x):
    y = x * 2
    assert y.shape[0] == 5, f"got {y.shape[0]}"
    return y


@case(1, 0, ones(4))
def assert_on_tensor_value(x):
    assert (x > -100).all(), "out of range"
    return x * 2


# == raising exceptions ============================================================================
@case(0, 1, t(4))
def raise_value_error(x):
    if x.dim() != 2:
        raise ValueError(f"expected 2-D, got {x.dim()}-D")
    return x


@case(1, 1, t(4))
def raise_after_ops(x):
    y = x * 2
    if y.shape[0] == 4:
        raise ValueError("too long")
    return y


def _check_int64(t):
    if t.dtype != torch.int64:
        raise TypeError(f"need int64, got {t.dtype}")
    return t


@case(1, 2, t(4))
def raise_in_helper(x):
    y = x + 1
    return _check_int64(y)


@case(1, 1, t(4))
def raise_user_exception(x):
    y = x.sum()
    raise MyError("bad", y.dim())


@case(1, 2, ones(4))
def raise_after_tensor_branch(x):
    if (x > 0).all():
        raise RuntimeError("all positive")
    return x


@case(1, 0, t(4))
def caught_key_error(x):
    try:
        v = {"a": 1}["b"]
    except KeyError:
        v = 2
    return x * v


@case(1, 1, lambda: {"a": torch.ones(2)})
def raise_key_error_from_lookup(d):
    y = d["a"] * 2
    return y + d["missing"]


# == grad mode =====================================================================================
def t_grad(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape, requires_grad=True)


@torch.no_grad()
def _no_grad_helper(x):
    return x * 2


@case(1, 0, t_grad(4))
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + 1, x * 3


@case(1, 0, t_grad(4))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 3
    return y, z


@case(1, 0, t_grad(4))
def no_grad_decorated_helper(x):
    return _no_grad_helper(x) + x


@case(1, 0, t_grad(4))
def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
    return y, x.cos()


@case(2, 1, t_grad(4))
def break_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
        z = y + 1
    return z


@case(2, 1, t_grad(4))
def break_after_no_grad(x):
    with torch.no_grad():
        y = x * 2
    print("after no_grad")
    return y + x


@case(1, 0, t_grad(4))
def branch_on_grad_enabled(x):
    if torch.is_grad_enabled():
        return x * 2
    return x * 3


# == side effects ==================================================================================
@case(1, 0, t(4), setup=reset_globals, effects=globals_now)
def global_int_store(x):
    global COUNTER
    COUNTER += 1
    return x * COUNTER


@case(1, 0, t(4), setup=reset_globals, effects=globals_now)
def global_tensor_store(x):
    global LAST
    LAST = x * 2
    return LAST + 1


@case(1, 1, t(4), setup=reset_globals, effects=globals_now)
def global_store_then_break(x):
    global COUNTER
    COUNTER += 1
    print("counter", COUNTER)
    return x + COUNTER


@case(1, 0, t(4), setup=reset_globals, effects=globals_now)
def global_list_append(x):
    LOG.append(len(LOG))
    LOG.append(x.shape[0])
    return x * len(LOG)


@case(1, 0, t(4), const([]))
def list_append_argument(x, out):
    out.append(x * 2)
    return len(out)


@case(1, 0, t(4), lambda: {"drop": 1, "keep": 2})
def dict_mutation_argument(x, d):
    d["y"] = x + 1
    d.pop("drop")
    del d["keep"]
    return d["y"]


@case(2, 1, t(4), const([]))
def list_mutation_around_break(x, log):
    log.append("start")
    y = x * 2
    print("logged")
    log.append("end")
    return y + 1


def _make_totaling():
    total = 0

    def nonlocal_update(x):
        nonlocal total
        total = total + 1
        return x * total

    return nonlocal_update


_totaling = _make_totaling()
case(
    1,
    0,
    t(4),
    setup=lambda: setattr(cell(_totaling, "total"), "cell_contents", 0),
    effects=lambda: cell(_totaling, "total").cell_contents,
)(_totaling)


@case(1, 0, t(2, 4), lambda: Counted())
def module_attribute_store(x, mod):
    mod.calls += 1
    return mod.lin(x) * mod.calls


@case(1, 0, t(2, 4), lambda: Counted())
def module_forward_counts_calls(x, mod):
    return mod(x) + mod(x)


@case(1, 0, t(4), lambda: Counted())
def module_buffer_inplace(x, mod):
    mod.running.mul_(0.9).add_(x.mean())
    return mod.running * 2


@case(1, 0, t(4), lambda: Scaler(1.0))
def object_list_append(x, s):
    s.history.append(x.sum())
    return len(s.history)


@case(2, 1, t(4), lambda: Holder())
def object_store_order_across_break(x, h):
    h.a = x.sum()
    print("between")
    h.b = h.a * 2
    return h.b


@case(1, 0, t(4), lambda: [1, 2, 3])
def list_methods_on_argument(x, xs):
    xs.insert(0, 0)
    xs.reverse()
    xs.remove(2)
    xs.extend([9])
    return x * xs.pop()


# == what a break must carry over: aliasing, odd locals, ordering of effects =======================
@case(1, 1, t(4))
def list_alias_across_break(x):
    a = []
    b = a
    a.append(x)
    print("alias")
    b.append(x * 2)
    return len(a), a[1]


@case(2, 1, t(4))
def view_mutated_after_break(x):
    y = x.view(2, 2)
    print("view")
    y.add_(1)
    return x


@case(2, 1, t(4))
def dict_of_tensors_across_break(x):
    d = {"a": x + 1, "n": 3}
    print("dict")
    return d["a"] * d["n"]


@case(2, 1, t(4))
def break_inside_tuple_display(x):
    return (x + 1, print("p"), x * 2)


@case(1, 1, t(4))
def deleted_local_across_break(x):
    y = x + 1
    del x
    print("deleted")
    return y


@case(1, 1, t(6))
def slice_and_size_locals_across_break(x):
    s = slice(1, 5, 2)
    shape = x.shape
    dt = x.dtype
    print("odd locals")
    return x[s].to(torch.float64).to(dt).reshape(shape[0] // 3, -1)


def _bump_and_print():
    global COUNTER
    COUNTER += 1
    print("bumped")


@case(2, 2, t(4), setup=reset_globals, effects=globals_now)
def global_changed_by_breaking_call(x):
    y = x * COUNTER
    _bump_and_print()
    return y + x * COUNTER


def _push_and_print(lst, v):
    lst.append(v)
    print("pushed")


@case(2, 2, t(4))
def list_mutated_before_break_in_callee(x):
    lst = []
    _push_and_print(lst, x + 1)
    return torch.stack(lst)


@case(2, 1, t(4))
def method_pending_below_break(x):
    vals = []
    vals.append(x.sum().item())
    return x * vals[0]


class _Ctx:
    def __init__(self) -> None:
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        return False


@case(1, 0, t(4), lambda: _Ctx())
def user_context_manager(x, ctx):
    with ctx as c:
        y = x * (c.entered + 1)
    return y


# == a local name that is not an identifier (pytest's assertion rewriting makes them) ======
def _odd_local(x):
    tmp = x + 1
    print("odd local")
    return tmp * 2


local_named_by_pytest_rewrite = types.FunctionType(
    _odd_local.__code__.replace(
        co_varnames=("x", "@py_assert1"), co_name="local_named_by_pytest_rewrite"
    ),
    globals(),
)
case(2, 1, t(4))(local_named_by_pytest_rewrite)


# == known differences: strict xfails (fix ember, then delete the line) ============================
# Cases where ember gives a different result from eager: bugs. Keep this empty; a wrong
# result found later goes here (strict xfail) until it is fixed.
WRONG_RESULTS: dict[str, str] = {}

_NONLOCAL = (
    "a nonlocal store (STORE_DEREF) is neither captured nor broken at: the frame runs eagerly"
)
_REBUILD = (
    "a lambda, partial or bound method made inside the frame cannot be rebuilt at a break: "
    "the frame runs eagerly"
)
_CELLS = "a closure made in the frame and alive at the break needs the frame's very cells: eager"
_COMPREHENSION_FRAME = (
    "the frame breaks at the comprehension's call; the comprehension then runs as a frame of "
    "its own, whose argument is a real iterator ember does not read ahead: it runs eagerly"
)

COUNT_MISMATCHES: dict[str, tuple[str, str]] = {
    "listcomp_that_prints": ("1/1", _COMPREHENSION_FRAME),
    "random_randint": ("0/0", _REBUILD),
    "lambda_that_prints": ("1/1", _REBUILD),
    "partial_that_prints": ("1/1", _REBUILD),
    "makes_a_closure_and_breaks": ("1/0", _CELLS),
    "closure_appends_and_breaks": ("2/0", _CELLS),
    "assert_on_tensor_value": (
        "2/1",
        "an assert on a tensor's value breaks (Dynamo captures it as torch._assert)",
    ),
}


# == the tests =====================================================================================
class WrongResult(AssertionError):
    """Compiled and eager disagree (value, exception, arguments after the call, globals)."""


class CountMismatch(AssertionError):
    """The result is right but the graphs or breaks differ from the expectation."""


def _difference(got: Any, want: Any, path: str = "") -> str | None:
    """Where ``got`` differs from ``want``, in words; None when they are the same."""
    if type(got) is not type(want):
        return f"{path or 'value'}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        if got.requires_grad != want.requires_grad:
            return f"{path}: requires_grad {got.requires_grad} != {want.requires_grad}"
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
        except AssertionError as e:
            return f"{path}: {str(e).splitlines()[0]} ({got} vs {want})"
        return None
    if isinstance(want, list | tuple):
        if len(got) != len(want):
            return f"{path}: length {len(got)} != {len(want)}"
        diffs = (
            _difference(g, w, f"{path}[{i}]")
            for i, (g, w) in enumerate(zip(got, want, strict=True))
        )
        return next((d for d in diffs if d), None)
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)} != {list(want)}"
        return next(
            (d for k in want if (d := _difference(got[k], want[k], f"{path}[{k!r}]"))), None
        )
    if isinstance(want, functools.partial):
        return _difference(
            (got.func, got.args, got.keywords), (want.func, want.args, want.keywords)
        )
    if isinstance(want, types.FunctionType | types.BuiltinFunctionType | type):
        same = got.__qualname__ == want.__qualname__
        return None if same else f"{path}: {got!r} != {want!r}"
    if hasattr(want, "__dict__") and not isinstance(want, types.ModuleType):
        return _difference(vars(got), vars(want), f"{path}.")
    return None if got == want else f"{path or 'value'}: {got!r} != {want!r}"


@dataclasses.dataclass
class Outcome:
    result: tuple[Any, ...]  # ("return", value) or ("raise", type, message)
    state: tuple[Any, ...]  # the arguments and the watched globals, after the call


def _call(c: Case, fn: Callable[..., Any]) -> Outcome:
    if c.setup is not None:
        c.setup()
    torch.manual_seed(0)
    random.seed(0)
    args, kwargs = c.make()
    torch.manual_seed(1)
    random.seed(1)
    try:
        result: tuple[Any, ...] = ("return", fn(*args, **kwargs))
    except Exception as e:
        result = ("raise", type(e), str(e))
    effects = c.effects() if c.effects is not None else None
    return Outcome(result, (args, kwargs, effects))


@dataclasses.dataclass
class Run:
    case: Case
    wrong: str | None
    graphs: int
    breaks: int
    failures: list[str]

    @property
    def counts_match(self) -> bool:
        return (self.graphs, self.breaks) == (self.case.graphs, self.case.breaks)

    def describe(self) -> str:
        return (
            f"expected {self.case.graphs}/{self.case.breaks}, ember gives "
            f"{self.graphs}/{self.breaks}; failures: {self.failures}"
        )


_RUNS: dict[str, Run] = {}


def run_case(c: Case) -> Run:
    """Call ``c.fn`` once eagerly and once compiled (fresh inputs each), compare (memoized)."""
    if c.name in _RUNS:
        return _RUNS[c.name]
    ember.compiler.reset()
    want = _call(c, c.fn)
    counter = CompileCounter()
    compiled = ember.compiler.compile(c.fn, backend=counter)
    got = _call(c, compiled)
    ember.compiler.reset()
    wrong = _difference(got.result, want.result, "result") or _difference(
        got.state, want.state, "state"
    )
    if wrong and got.result[0] == "raise" and want.result[0] != "raise":
        wrong = f"ember raised {got.result[1].__name__}: {got.result[2]}"
    stats = compiled.stats
    failures = [f"{f.code}: {f.reason}" for f in stats.failures]
    run = Run(c, wrong, counter.frame_count, len(stats.breaks), failures)
    _RUNS[c.name] = run
    return run


def _param(c: Case) -> Any:
    marks = []
    if c.name in WRONG_RESULTS:
        reason = f"WRONG RESULT: {WRONG_RESULTS[c.name]}"
        marks.append(pytest.mark.xfail(strict=True, raises=WrongResult, reason=reason))
    elif c.name in COUNT_MISMATCHES:
        got, why = COUNT_MISMATCHES[c.name]
        reason = f"counts: expected {c.graphs}/{c.breaks}, ember gives {got}: {why}"
        marks.append(pytest.mark.xfail(strict=True, raises=CountMismatch, reason=reason))
    return pytest.param(c, id=c.name, marks=marks)


def test_corpus_is_big_and_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) >= 150, len(names)
    assert len(set(names)) == len(names)
    assert set(WRONG_RESULTS) | set(COUNT_MISMATCHES) <= set(names)
    assert not set(WRONG_RESULTS) & set(COUNT_MISMATCHES)


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_matches_eager_with_expected_counts(c, capsys):
    run = run_case(c)
    if run.wrong is not None:
        raise WrongResult(run.wrong)
    if not run.counts_match:
        raise CountMismatch(run.describe())


@pytest.mark.xfail(
    bool(WRONG_RESULTS),
    strict=True,
    raises=WrongResult,
    reason=f"WRONG RESULT in {len(WRONG_RESULTS)} cases: {', '.join(WRONG_RESULTS)}",
)
def test_share_captured_without_a_break(capsys):
    """Print how much of the corpus ember captures cleanly; fail on any wrong result."""
    runs = [run_case(c) for c in CASES]
    clean = sum(r.breaks == 0 and not r.failures for r in runs)
    matching = sum(r.counts_match for r in runs)
    wrong = [f"{r.case.name}: {r.wrong}" for r in runs if r.wrong is not None]
    with capsys.disabled():
        print(
            f"\n{len(runs)} cases: {clean}/{len(runs)} ({clean / len(runs):.0%}) captured with no "
            f"break and no eager frame; {matching}/{len(runs)} ({matching / len(runs):.0%}) with "
            f"the expected counts; {len(wrong)} wrong results"
        )
    if wrong:
        raise WrongResult("\n".join(wrong))
