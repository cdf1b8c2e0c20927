"""The Python that library code leans on, inside compiled code, against CPython itself.

Each function runs eagerly and compiled on the same inputs: tensors must be close, plain
values equal, exceptions the same (type and message). Most must be one graph with no
break (``fullgraph=True``); where a construct cannot be captured, the test pins the break
and its reason, and the answer must still be CPython's.
"""

from __future__ import annotations

import abc
import collections
import collections.abc
import dataclasses
import functools
import inspect
import numbers
import typing

import pytest
import torch

import ember.compiler
from ember.compiler.testing import CompileCounter, check_like_eager

X = torch.randn(3, 4)


# -- zero-argument super() ----------------------------------------------------------------------


class Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale

    def extra(self, x):
        return x + 1


class Child(Base):
    def forward(self, x):
        y = super().forward(x)
        return super().extra(y).sin()


class Grandchild(Child):
    def forward(self, x):
        return super().forward(x) + 1


def test_zero_argument_super_in_a_module_chain_is_one_graph():
    model = Grandchild()
    check_like_eager(model, X)


class Captured(Base):
    def forward(self, x):
        def inner():
            return self.scale  # self is also a cell: super() finds it in the cell

        return super().forward(x) * inner()


def test_zero_argument_super_with_self_captured_by_a_closure():
    check_like_eager(Captured(), X)


class AfterBreak(Base):
    def forward(self, x):
        y = x.cos()
        print("", end="")  # a break: the rest runs in a resume function
        return super().forward(y) + super().extra(y)


def test_zero_argument_super_in_a_resumed_function():
    model = AfterBreak()
    compiled = check_like_eager(model, X, graphs=None)
    assert len(compiled.stats.breaks) == 1


class CapturedAfterBreak(Base):
    def forward(self, x):
        y = x.cos()
        print("", end="")
        return super().forward(y) + (lambda: self.scale)()


def test_zero_argument_super_resumed_with_self_in_a_cell():
    check_like_eager(CapturedAfterBreak(), X, graphs=None)


# -- function and code attributes ----------------------------------------------------------------


def helper(x, k=2, *, mode="a"):
    return x * k


def test_function_attributes_are_constants():
    def f(x):
        code = helper.__code__
        info = (
            helper.__name__,
            helper.__qualname__,
            code.co_varnames,
            code.co_argcount,
            helper.__defaults__,
            helper.__kwdefaults__,
        )
        return x + code.co_argcount, info

    check_like_eager(f, X)


def test_wrapped_is_followed():
    @functools.wraps(helper)
    def wrapper(*args, **kwargs):
        return helper(*args, **kwargs) + 1

    def f(x):
        return wrapper(x, 3), wrapper.__wrapped__ is helper, wrapper.__name__

    check_like_eager(f, X)


def test_replacing_code_or_defaults_recompiles():
    def g(x, k=2):
        return x * k

    def f(x):
        return g(x)

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    torch.testing.assert_close(compiled(X), X * 2)
    g.__defaults__ = (5,)
    torch.testing.assert_close(compiled(X), X * 5)
    g.__code__ = (lambda x, k=2: x - k).__code__
    torch.testing.assert_close(compiled(X), X - 5)
    assert counter.frame_count == 3


def test_replacing_kwdefaults_recompiles():
    def g(x, *, k=2):
        return x * k

    def f(x):
        return g(x)

    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(X), X * 2)
    g.__kwdefaults__ = {"k": 7}
    torch.testing.assert_close(compiled(X), X * 7)


def test_reading_defaults_recompiles_when_they_change():
    def g(x, k=2):
        return x

    def f(x):
        return x * g.__defaults__[0]

    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(X), X * 2)
    g.__defaults__ = (3,)
    torch.testing.assert_close(compiled(X), X * 3)


# -- inspect.signature ---------------------------------------------------------------------------


class Sig(torch.nn.Module):
    def forward(self, x, mask=None, *, scale=1.0, **kwargs):
        return x * scale


def test_signature_of_a_bound_method_and_its_parameters():
    model = Sig()

    def f(x):
        sig = inspect.signature(model.forward)
        names = list(sig.parameters)
        p = sig.parameters["scale"]
        kinds = [q.kind for q in sig.parameters.values()]
        return x * p.default, names, p.default, p.kind == p.KEYWORD_ONLY, kinds

    check_like_eager(f, X)


def test_signature_bind_runs_natively_with_a_reason():
    model = Sig()

    def f(x):
        bound = inspect.signature(model.forward).bind(x, scale=3.0)
        return x.sin() * bound.arguments["scale"]

    compiled = check_like_eager(f, X, graphs=None)
    # the signature is made inside the frame and cannot be rebuilt at a break: eager
    (failure,) = compiled.stats.failures
    assert "Signature.bind" in failure.reason


def test_signature_filters_kwargs_like_a_library():
    def target(x, alpha=1.0):
        return x * alpha

    def f(x, **kwargs):
        accepted = set(inspect.signature(target).parameters)
        return target(x, **{k: v for k, v in kwargs.items() if k in accepted})

    check_like_eager(lambda x: f(x, alpha=2.0, unused=3), X)


# -- object.__getattribute__ / __setattr__ -------------------------------------------------------


class Guarded:
    def __init__(self, w):
        object.__setattr__(self, "w", w)

    def __setattr__(self, name, value):
        raise AttributeError("frozen")


def test_object_getattribute_and_setattr():
    def f(x):
        g = Guarded(2.0)
        return x * object.__getattribute__(g, "w")

    check_like_eager(f, X)


def test_object_setattr_on_an_argument_is_replayed():
    class Box:
        pass

    box = Box()

    def f(x):
        object.__setattr__(box, "v", 3)
        return x * object.__getattribute__(box, "v")

    check_like_eager(f, X, graphs=None)
    assert box.v == 3


# -- dataclasses ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: torch.Tensor
    y: float = 1.0
    tags: list = dataclasses.field(default_factory=list)


class ModelOutput(collections.OrderedDict):
    """Like ``transformers.utils.ModelOutput``: a dataclass that is also an ordered dict."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class Output(ModelOutput):
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    loss: torch.Tensor | None = None


def test_dataclass_fields_replace_asdict():
    def f(x):
        p = Point(x, 2.0)
        names = [fl.name for fl in dataclasses.fields(p)]
        q = dataclasses.replace(p, y=3.0)
        d = dataclasses.asdict(q)
        return q.x * q.y + d["x"], names, d["y"], d["tags"], dataclasses.is_dataclass(p)

    check_like_eager(f, X)


def test_model_output_like_dataclass_built_read_and_returned():
    def f(x):
        out = Output(logits=x.sin(), hidden=x.cos())
        a = out.logits + out["hidden"] + out[0] + out[1]
        return a, len(out), list(out.keys()), out.loss is None, out

    compiled = check_like_eager(f, X)
    result = compiled(X)[4]
    assert type(result) is Output and list(result.keys()) == ["logits", "hidden"]
    torch.testing.assert_close(result.hidden, X.cos())


def test_dict_views_are_not_used_up_and_iterators_are():
    def f(x):
        d = {"a": 1, "b": 2}
        ks = d.keys()
        found = "b" in ks
        it = iter([1, 2, 3, 4])
        return x + 1, found, list(ks), list(ks), 2 in it, list(it), "a" in d.items()

    check_like_eager(f, X)


# -- functools -----------------------------------------------------------------------------------


def test_partial_and_wraps():
    def scale(x, k, *, shift=0.0):
        return x * k + shift

    p = functools.partial(scale, k=3.0, shift=1.0)

    def f(x):
        q = functools.partial(scale, shift=2.0)
        return p(x) + q(x, 2.0), p.args, sorted(p.keywords)

    check_like_eager(f, X)


@functools.lru_cache(maxsize=8)
def _table(n):
    return tuple(range(n))


def test_lru_cache_of_a_pure_function_with_constants():
    def f(x):
        return x + sum(_table(4))

    check_like_eager(f, X)


@functools.lru_cache(maxsize=8)
def _cached_tensor_fn(x):
    return x * 2


def test_lru_cache_called_with_tensors_is_correct():
    def f(x):
        return _cached_tensor_fn(x) + 1

    compiled = ember.compiler.compile(f, backend="eager")
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(compiled(a), f(a))
    torch.testing.assert_close(compiled(b), b * 2 + 1)


# -- collections ---------------------------------------------------------------------------------


def test_ordered_dict_and_its_methods():
    def f(x):
        d = collections.OrderedDict()
        d["b"] = x
        d["a"] = x + 1
        d.move_to_end("b")
        first = next(iter(d))
        k, v = d.popitem(last=False)
        return v + d["b"], first, k, list(d)

    check_like_eager(f, X)


def test_defaultdict_missing():
    def f(x):
        d = collections.defaultdict(list)
        d["a"].append(x)
        d["a"].append(x + 1)
        counts = collections.defaultdict(int)
        for k in "abca":
            counts[k] += 1
        return torch.stack(d["a"]).sum(0), dict(counts), "z" in counts

    check_like_eager(f, X)


class DefaultZero(collections.defaultdict):
    def __missing__(self, key):
        return key * 2


def test_defaultdict_subclass_missing():
    def f(x):
        d = DefaultZero()
        return x * d[3]

    check_like_eager(f, X)


class Pair(collections.namedtuple("Pair", ["a", "b"])):
    __slots__ = ()

    @property
    def total(self):
        return self.a + self.b

    def swap(self):
        return Pair(self.b, self.a)


def test_namedtuple_subclass_with_methods():
    def f(x):
        p = Pair(x, x * 2)
        s = p.swap()
        return p.total, s.a, s._replace(a=1).a, p._asdict()["b"], p._fields

    check_like_eager(f, X)


def test_namedtuple_returned_and_indexed():
    P = collections.namedtuple("P", "a b")

    def f(x):
        p = P(x, 2)
        a, b = p
        return P(a * b, p[1]), p.b

    check_like_eager(f, X)


# -- isinstance / issubclass ---------------------------------------------------------------------


class UserABC(abc.ABC):
    @abc.abstractmethod
    def go(self): ...


class Registered:
    pass


UserABC.register(Registered)


def test_isinstance_over_abcs_and_typing_aliases():
    def f(x):
        d, lst, t = {"a": 1}, [1], (1,)
        checks = (
            isinstance(d, collections.abc.Mapping),
            isinstance(lst, collections.abc.Sequence),
            isinstance(d, collections.abc.Sequence),
            isinstance(t, (list, tuple)),
            isinstance(d, typing.Mapping),
            isinstance(1.5, numbers.Number),
            isinstance(x, numbers.Number),
            isinstance(Registered(), UserABC),
            issubclass(Registered, UserABC),
            issubclass(dict, collections.abc.Mapping),
            isinstance(collections.OrderedDict(), dict),
        )
        return x + 1, checks

    check_like_eager(f, X)


# -- getattr / hasattr ---------------------------------------------------------------------------


class Props:
    def __init__(self):
        self.a = 1

    @property
    def broken(self):
        raise AttributeError("nope")

    @property
    def fine(self):
        return 5


def test_getattr_default_and_hasattr():
    import math

    obj = Props()

    def f(x):
        local = Props()
        return x + 1, (
            getattr(obj, "a", 0),
            getattr(obj, "missing", 7),
            hasattr(obj, "broken"),
            getattr(obj, "broken", "dflt"),
            hasattr(obj, "fine"),
            hasattr(math, "pi"),
            getattr(math, "nope", None),
            hasattr(x, "shape"),
            getattr(x, "nope", 3),
            hasattr(local, "a"),
            getattr(local, "zzz", 4),
            hasattr(local, "broken"),
        )

    check_like_eager(f, X)


# -- generators and comprehensions ---------------------------------------------------------------


def test_comprehensions_and_genexps():
    def f(xs, k):
        scaled = [x * k for x in xs]
        named = {f"t{i}": x for i, x in enumerate(scaled)}
        sizes = {x.shape[0] for x in xs}
        nested = [[x * j for j in range(2)] for x in xs if x.shape[0] > 1]
        flags = (
            any(x.shape[0] > 2 for x in xs),
            all(x.dim() == 1 for x in xs),
            sum(x.shape[0] for x in xs),
        )
        total = sum(x.sum() for x in scaled)
        return tuple(x + 1 for x in xs), named, sizes, nested, flags, total

    check_like_eager(f, [torch.randn(3), torch.randn(3)], 2.0)


def test_a_generator_function_consumed_by_tuple():
    def pieces(xs):
        for i, x in enumerate(xs):
            yield x * i

    def f(xs):
        return tuple(pieces(xs)), next(zip(pieces(xs), pieces(xs), strict=True))[0]

    check_like_eager(f, [torch.randn(2), torch.randn(2)])


def _uncaptured_cases():
    def factory_replaced(x):
        d = collections.defaultdict(list)
        d.default_factory = int  # a store into the C type's slot: not modelled
        return x + d["a"]

    def partial_of_a_method(x):
        p = functools.partial(Sig().forward, scale=2.0)
        return p(x), p.__dict__

    return [factory_replaced, partial_of_a_method]


@pytest.mark.parametrize("fn", _uncaptured_cases(), ids=lambda fn: fn.__name__)
def test_what_is_not_captured_yet_still_gives_cpython_s_answer(fn):
    compiled = check_like_eager(fn, X, graphs=None)
    reasons = [b.reason for b in compiled.stats.breaks] + [
        f.reason for f in compiled.stats.failures
    ]
    assert reasons and all(reasons)  # a break or an eager frame, each with its reason
