"""Variants of the stdlib objects of ``test_python_semantics.py``, against CPython itself:
``OrderedDict``/``defaultdict`` and their subclasses made in the trace, namedtuple helpers,
``functools.partial`` attributes, ``lru_cache`` wrappers and ``inspect.Signature.bind``.
Each must be one graph with no break and give eager's answer."""

from __future__ import annotations

import collections
import functools

import pytest
import torch

import ember.compiler
from ember.compiler.testing import check_like_eager

X = torch.randn(3, 4)

# -- OrderedDict / defaultdict -------------------------------------------------------------------


class MyOD(collections.OrderedDict):
    pass


class Counting(collections.defaultdict):
    def __init__(self):
        super().__init__(int)


class Recording(collections.OrderedDict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value * 2)


def test_ordered_dict_built_from_kwargs_pairs_and_a_dict_and_returned():
    def f(x):
        a = collections.OrderedDict(a=x, b=1)
        b = collections.OrderedDict([("z", x + 1), ("a", 2)])
        c = collections.OrderedDict({"q": x * 2}, r=3)
        return a, b, c, MyOD(c)

    check_like_eager(f, X)


def test_ordered_dict_item_get_set_del_and_reordering():
    def f(x):
        d = collections.OrderedDict(a=1, b=2, c=3)
        del d["b"]
        d["b"] = x
        key, value = d.popitem()
        d.move_to_end("c", last=False)
        d.move_to_end("a")
        first = d.popitem(last=False)
        return value + 1, key, first, list(d), list(reversed(d)), d.get("zz", 4), d

    check_like_eager(f, X)


def test_ordered_dict_equality_is_ordered_only_between_ordered_dicts():
    def f(x):
        a = collections.OrderedDict(a=1, b=2)
        b = collections.OrderedDict(b=2, a=1)
        return x + 1, a == b, a == {"b": 2, "a": 1}, {"a": 1, "b": 2} == b, a != b, a == a

    check_like_eager(f, X)


def test_move_to_end_of_a_missing_key_raises_key_error():
    def f(x):
        d = collections.OrderedDict(a=x)
        try:
            d.move_to_end("zz")
        except KeyError as e:
            return x + 1, e.args
        return x

    check_like_eager(f, X)


def test_defaultdict_returned_with_its_factory_and_order():
    def f(x):
        d = collections.defaultdict(list)
        d["k"].append(x)
        d["j"].append(x + 1)
        d["k"].append(x * 2)
        return d, torch.stack(d["k"]).sum(0)

    got = check_like_eager(f, X)(X)
    assert got[0].default_factory is list


def test_defaultdict_without_a_factory_raises_key_error():
    def f(x):
        d = collections.defaultdict(None, a=1)
        try:
            return d["b"]
        except KeyError:
            return x + d["a"]

    check_like_eager(f, X)


def test_defaultdict_subclass_with_init_calling_super():
    def f(x):
        d = Counting()
        for k in "abca":
            d[k] += 1
        return x * d["a"], d, d.default_factory

    check_like_eager(f, X)


def test_ordered_dict_subclass_setitem_override_is_traced():
    def f(x):
        d = Recording()
        d["a"] = x
        d["b"] = 3
        return d["a"], d, isinstance(d, collections.OrderedDict), isinstance(d, dict)

    check_like_eager(f, X)


def test_defaultdict_argument_missing_key_is_written_back():
    def f(x, d):
        d["new"].append(1)
        return x + len(d["old"]), dict(d)

    d = collections.defaultdict(list)
    d["old"].append(1)
    check_like_eager(f, X, d)
    assert dict(d) == {"old": [1], "new": [1, 1]}  # eager once, compiled once


def test_move_to_end_is_not_a_dict_method():
    def f(x):
        d = {"a": 1}
        try:
            d.move_to_end("a")
        except AttributeError as e:
            return x + 1, str(e)
        return x

    check_like_eager(f, X)


# -- namedtuple helpers --------------------------------------------------------------------------

Point = collections.namedtuple("Point", ["x", "y"], defaults=[0])


def test_namedtuple_helpers_on_one_made_in_the_trace():
    def f(t):
        p = Point(t, t + 1)
        q = p._replace(y=3)
        r = Point._make([t * 2, 5])
        return q, p._asdict(), r, Point._fields, p._fields, Point._field_defaults, q.y * t

    check_like_eager(f, X)


def test_namedtuple_helpers_on_one_passed_in():
    def f(p):
        return p._replace(x=p.x * 2), p._asdict(), type(p)._make(reversed(p)), p._make((1, p.y))

    check_like_eager(f, Point(X, X + 1))


def test_namedtuple_replace_with_an_unknown_field_raises():
    def f(t):
        try:
            Point(t, 1)._replace(z=2)
        except ValueError as e:
            return t + 1, str(e)
        return t

    check_like_eager(f, X)


def test_namedtuple_make_with_the_wrong_length_raises():
    def f(t):
        try:
            Point._make([t])
        except TypeError as e:
            return t + 1, str(e)
        return t

    check_like_eager(f, X)


# -- functools.partial ---------------------------------------------------------------------------


def _scale(x, k, *, shift=0.0):
    return x * k + shift


def test_partial_attributes_of_one_made_in_the_trace():
    def f(x):
        p = functools.partial(_scale, x, shift=1.0)
        q = functools.partial(p, 2.0)
        return q(), p.func is _scale, p.args[0] + 1, p.keywords, q.args, q.func is p

    check_like_eager(f, X)


def test_partial_keywords_mutated_in_the_trace_change_later_calls():
    def f(x):
        p = functools.partial(_scale, k=2.0)
        p.keywords["k"] = 5.0
        return p(x), dict(p.keywords)

    check_like_eager(f, X)


def test_partial_argument_keywords_are_guarded():
    p = functools.partial(_scale, k=2.0, shift=1.0)

    def f(x):
        return p(x), sorted(p.keywords), p.args

    check_like_eager(f, X)
    compiled = ember.compiler.compile(f, backend="eager")
    compiled(X)
    p.keywords["shift"] = 10.0  # the same partial, another keyword value: recompiles
    torch.testing.assert_close(compiled(X)[0], X * 2.0 + 10.0)
    p.keywords["extra"] = 1  # a new keyword: recompiles (and eager raises)
    with pytest.raises(TypeError):
        compiled(X)


def test_partial_argument_keywords_mutated_in_the_trace_are_written_back():
    p = functools.partial(_scale, k=2.0)

    def f(x):
        p.keywords["k"] = 3.0
        return p(x)

    torch.testing.assert_close(ember.compiler.compile(f, backend="eager")(X), X * 3.0)
    assert p.keywords == {"k": 3.0}


# -- functools.lru_cache / cache -----------------------------------------------------------------


@functools.cache
def _powers(n):
    return tuple(2**i for i in range(n))


@functools.lru_cache(maxsize=4)
def _affine(x, scale=2.0):
    return x * scale + 1


def test_cached_functions_are_traced_and_their_cache_left_alone():
    _powers.cache_clear()
    _affine.cache_clear()

    def f(x):
        return _affine(x, scale=3.0) + sum(_powers(3)), _powers(2)

    check_like_eager(f, X)
    assert _powers.cache_info().currsize == 2  # the eager run's calls only
    assert _affine.cache_info().currsize == 1


def test_a_cached_function_rebound_recompiles():
    g = {"fn": _affine}

    def f(x):
        return g["fn"](x)

    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(X), X * 2 + 1)
    g["fn"] = functools.lru_cache(lambda x: x - 1)
    torch.testing.assert_close(compiled(X), X - 1)
