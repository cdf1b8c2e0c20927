"""Shape guards: dynamic dims in TENSOR_MATCH, size/stride sources, SHAPE_RELATION."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.guards as eg
from ember.guards import Local, TensorSize, TensorStride, _accel
from ember.guards.codegen import build_fetch
from ember.guards.specs import TensorSpec, tensor_mismatch

X, Y, N = Local("x"), Local("y"), Local("n")
FRAME = eg.FrameSpec("f", ("x", "y", "n"), {}, {})


def compiled(*guards: eg.Guard) -> eg.CompiledGuards:
    return eg.GuardSet(guards).compile(FRAME)


def agree(c: eg.CompiledGuards, *args: object) -> tuple[bool, str | None]:
    """The check and the explanation, which must agree on pass/fail."""
    ok, why = c.check(*args), c.explain_failure(*args)
    assert ok is (why is None), (ok, why)
    return ok, why


# --- dynamic dims in TENSOR_MATCH ---------------------------------------------


def test_dynamic_size_accepts_any_value_but_checks_rank_and_static_dims() -> None:
    c = compiled(eg.tensor_match(X, torch.zeros(8, 4), dynamic_sizes={0}))
    assert agree(c, torch.zeros(8, 4), 0, 0) == (True, None)
    assert agree(c, torch.zeros(3, 4), 0, 0) == (True, None)
    assert agree(c, torch.zeros(100, 4), 0, 0) == (True, None)
    assert agree(c, torch.zeros(8, 5), 0, 0) == (False, "x: size[1] expected 4, got 5")
    assert agree(c, torch.zeros(8), 0, 0) == (False, "x: size expected (*, 4), got (8,)")
    assert agree(c, torch.zeros(8, 4, 1), 0, 0)[0] is False
    assert agree(c, torch.zeros(8, 4, dtype=torch.int64), 0, 0)[0] is False


def test_a_dynamic_size_keeps_its_strides_checked_unless_asked() -> None:
    y = torch.zeros(4, 16)  # (4, B): stride[0] is B
    static_strides = compiled(eg.tensor_match(Y, y, dynamic_sizes={1}))
    ok, why = agree(static_strides, 0, torch.zeros(4, 6), 0)
    assert (ok, why) == (False, "y: stride[0] expected 16, got 6")
    loose = compiled(eg.tensor_match(Y, y, dynamic_sizes={1}, dynamic_strides={0}))
    assert agree(loose, 0, torch.zeros(4, 6), 0) == (True, None)
    # stride[1] is still checked: a transposed layout differs there
    ok, why = agree(loose, 0, torch.zeros(6, 4).t(), 0)
    assert (ok, why) == (False, "y: stride[1] expected 1, got 4")


def test_dynamic_stride_alone_leaves_sizes_checked() -> None:
    c = compiled(eg.tensor_match(X, torch.zeros(4, 8)[:, ::2], dynamic_strides={1}))
    assert agree(c, torch.zeros(4, 8)[:, ::2], 0, 0)[0] is True
    assert agree(c, torch.zeros(4, 8)[:, :4], 0, 0)[0] is True  # stride[1] 1, not 2: free
    assert agree(c, torch.zeros(4, 5), 0, 0) == (False, "x: size[1] expected 4, got 5")
    assert agree(c, torch.zeros(4, 4).t(), 0, 0)[1] == "x: stride[0] expected 8, got 1"


def test_sizes_zero_and_one_specialise_and_say_so() -> None:
    for size in (0, 1):
        spec = TensorSpec.of(torch.zeros(size, 3), dynamic_sizes={0})
        assert spec.size == (size, 3) and spec.specialized == frozenset({0})
        assert "specialized=[0]" in str(spec)
        note = "(sizes 0 and 1 specialise: this dim was marked dynamic)"
        want = f"size[0] expected {size}, got 5 {note}"
        assert tensor_mismatch(spec, torch.zeros(5, 3)) == want
        c = compiled(eg.Guard(X, eg.GuardKind.TENSOR_MATCH, spec))
        assert agree(c, torch.zeros(5, 3), 0, 0) == (False, f"x: {want}")
        assert agree(c, torch.zeros(size, 3), 0, 0) == (True, None)
    # a static dim that differs says nothing about specialisation
    spec = TensorSpec.of(torch.zeros(1, 3), dynamic_sizes={0})
    assert tensor_mismatch(spec, torch.zeros(1, 4)) == "size[1] expected 3, got 4"
    free = TensorSpec.of(torch.zeros(1, 3), dynamic_sizes={0}, specialize_zero_one=False)
    assert free.size == (None, 3) and tensor_mismatch(free, torch.zeros(7, 3)) is None


@pytest.mark.parametrize("dims", [{2}, {-1}, {True}, {"0"}])
def test_dynamic_dims_out_of_range_are_rejected(dims: set[object]) -> None:
    with pytest.raises(ValueError, match="out of range for a tensor of rank 2"):
        eg.tensor_match(X, torch.zeros(2, 3), dynamic_sizes=dims)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dynamic_strides"):
        TensorSpec.of(torch.zeros(2, 3), dynamic_strides=dims)  # type: ignore[arg-type]


def test_static_and_dynamic_specs_of_one_tensor_are_different_guards() -> None:
    t = torch.zeros(4, 2)
    guards = eg.GuardSet([eg.tensor_match(X, t), eg.tensor_match(X, t, dynamic_sizes=[0])])
    assert len(guards) == 2
    again = eg.tensor_match(X, t, dynamic_sizes=(0,))
    assert len(guards | [again]) == 2
    assert "size=(*, 2)" in str(guards)


def _tensor_matchers() -> list[object]:
    found = [m.tensor_match for m in (_accel._NATIVE, _accel._CXX) if m is not None]
    return [*found, _accel.py_tensor_match]


def _tensors() -> list[object]:
    base = torch.arange(24.0).reshape(4, 6)
    return [
        base, base.t(), base[:, ::2], base[:2], base.reshape(2, 12), base.reshape(24),
        base.expand(3, 4, 6), torch.zeros(1, 6), torch.zeros(0, 6), torch.zeros(7, 6),
        base.to(torch.float64), base.to_sparse(), torch.zeros(()), 3, None,
    ]  # fmt: skip


@pytest.mark.parametrize("matcher", _tensor_matchers(), ids=lambda m: getattr(m, "__module__", "?"))
def test_dynamic_tensor_match_twins_agree(matcher) -> None:  # type: ignore[no-untyped-def]
    values = _tensors()
    specs = []
    for t in values:
        if isinstance(t, torch.Tensor) and t.layout is torch.strided:
            rank = t.dim()
            for dims in itertools.chain.from_iterable(
                itertools.combinations(range(rank), k) for k in range(rank + 1)
            ):
                specs.append(TensorSpec.of(t, dynamic_sizes=dims))
                specs.append(TensorSpec.of(t, dynamic_sizes=dims, dynamic_strides=dims))
    assert len(specs) > 40
    for spec, value in itertools.product(specs, values):
        packed = _accel.pack_tensor(spec)
        got = matcher(packed, value)
        assert got is _accel.py_tensor_match(packed, value), (spec, value)
        assert got is (tensor_mismatch(spec, value) is None), (spec, value)


# --- size and stride sources ------------------------------------------------


def test_size_and_stride_sources_print_and_fetch() -> None:
    size, stride = TensorSize(X, 0), TensorStride(eg.Attr(X, "mT"), 1)
    assert (str(size), str(stride)) == ("x.size(0)", "x.mT.stride(1)")
    assert size.root() == X and stride.depth() == 2
    t = torch.zeros(5, 3)
    assert build_fetch(size, FRAME)(t, 0, 0) == 5
    assert build_fetch(stride, FRAME)(t, 0, 0) == 3
    for bad in (-1, 1.0, True, "0"):
        with pytest.raises(ValueError, match="a dim must be an int >= 0"):
            TensorSize(X, bad)  # type: ignore[arg-type]


def test_size_fetchers_twins_agree() -> None:
    pairs = [(_accel.size_at, _accel.py_size_at), (_accel.stride_at, _accel.py_stride_at)]
    for built in (_accel._CXX, _accel._NATIVE):
        if built is not None:
            pairs += [(built.size_at, _accel.py_size_at), (built.stride_at, _accel.py_stride_at)]
    assert len(pairs) == 2 + 2 * (_accel._CXX is not None) + 2 * (_accel._NATIVE is not None)
    for (fast, slow), value, dim in itertools.product(pairs, _tensors(), range(4)):
        try:
            want: object = slow(value, dim)
        except Exception:
            want = Exception
        try:
            got: object = fast(value, dim)
        except Exception:
            got = Exception
        assert got == want and type(got) is type(want), (fast, value, dim)


class Lying(torch.Tensor):
    def size(self, dim=None):  # type: ignore[no-untyped-def, override]
        return 99


def test_size_source_reads_the_tensor_not_a_python_override() -> None:
    t = torch.zeros(4, 2).as_subclass(Lying)
    assert t.size(0) == 99
    assert build_fetch(TensorSize(X, 0), FRAME)(t, 0, 0) == 4
    c = compiled(eg.shape_relation("s0 == 4", {"s0": TensorSize(X, 0)}))
    assert agree(c, t, 0, 0) == (True, None)


# --- SHAPE_RELATION -----------------------------------------------------------

B = TensorSize(X, 0)


def test_relation_pass_and_fail_with_a_bound_message() -> None:
    c = compiled(eg.shape_relation("s0 >= 2", {"s0": B}, where="m.py:3"))
    assert agree(c, torch.zeros(3), 0, 0) == (True, None)
    assert agree(c, torch.zeros(2), 0, 0) == (True, None)
    assert agree(c, torch.zeros(1), 0, 0) == (False, "s0: 1 is not >= 2 (s0 = x.size(0))")
    mirrored = compiled(eg.shape_relation("16 > s0", {"s0": B}))
    assert agree(mirrored, torch.zeros(16), 0, 0) == (
        False,
        "s0: 16 is not < 16 (s0 = x.size(0))",
    )
    negative = compiled(eg.shape_relation("s0 != -1", {"s0": Local("n")}))
    assert agree(negative, 0, 0, -1) == (False, "s0: -1 is not != -1 (s0 = n)")


def test_relation_between_two_tensors_explains_every_symbol() -> None:
    s1 = TensorSize(Y, 1)
    c = compiled(
        eg.tensor_match(X, torch.zeros(4, 3), dynamic_sizes={0}),
        eg.tensor_match(Y, torch.zeros(5, 2), dynamic_sizes={1}, dynamic_strides={0}),
        eg.shape_relation("s0 == 2*s1", {"s0": B, "s1": s1}),
    )
    assert agree(c, torch.zeros(4, 3), torch.zeros(5, 2), 0) == (True, None)
    assert agree(c, torch.zeros(10, 3), torch.zeros(5, 5), 0) == (True, None)
    want = "s0 == 2 * s1 is false with s0 = 3 (x.size(0)), s1 = 2 (y.size(1))"
    assert agree(c, torch.zeros(3, 3), torch.zeros(5, 2), 0) == (False, want)
    # a tensor of the wrong rank is reported by its tensor match, checked first
    ok, why = agree(c, torch.zeros(4), torch.zeros(5, 2), 0)
    assert (ok, why) == (False, "x: size expected (*, 3), got (4,)")


@pytest.mark.parametrize(
    ("expr", "holds", "fails"),
    [
        ("(s0 % 8) == 0", 16, 12),
        ("s0*s0 <= 4096", 64, 65),
        ("s0 // 3 == 2", 8, 9),
        ("min(s0, 10) == 10 and max(s0, 4) < 20", 12, 20),
        ("Eq(Mod(s0, 3), 0) or s0 == 1", 6, 5),
        ("(s0 >= 2) & ~(s0 > 9) | Eq(s0, 0)", 9, 10),
        ("FloorDiv(s0, 4) == 2", 11, 12),
        ("Ne(s0, 7)", 6, 7),
        ("2 <= s0 <= 5", 5, 6),
        ("not s0 == 3", 2, 3),
        ("-s0 + 10 >= 0", 10, 11),
        ("s0**2 > 8", 3, 2),
        ("Max(s0, 2) == s0", 2, 1),
    ],
)
def test_relation_grammar_evaluates_like_python(expr: str, holds: int, fails: int) -> None:
    c = compiled(eg.shape_relation(expr, {"s0": Local("n")}))
    assert agree(c, 0, 0, holds) == (True, None)
    ok, why = agree(c, 0, 0, fails)
    assert ok is False and why is not None
    assert f"s0 = {fails} (n)" in why or why.startswith(f"s0: {fails} is not ")


def test_relation_over_a_plain_int_argument() -> None:
    c = compiled(eg.shape_relation("n >= 1 and n < s0", {"n": N, "s0": B}))
    assert agree(c, torch.zeros(8), 0, 3) == (True, None)
    want = "n >= 1 and n < s0 is false with n = 9 (n), s0 = 8 (x.size(0))"
    assert agree(c, torch.zeros(8), 0, 9) == (False, want)
    # not an int: never compared as one (3.0, True and "3" are not the int 3)
    for bad in (3.0, True, "3", None):
        ok, why = agree(c, torch.zeros(8), 0, bad)
        assert ok is False and why == f"n = {bad!r} (n) is not an int"


def test_relations_deduplicate_by_meaning_and_keep_the_first_where() -> None:
    s1 = TensorSize(Y, 0)
    guards = eg.GuardSet(
        [
            eg.shape_relation("s0 >= 2", {"s0": B}, where="a.py:1"),
            eg.shape_relation("s0>=2", {"s0": B, "unused": s1}, where="a.py:2"),
            eg.shape_relation("b >= 2", {"b": B}, where="a.py:3"),
            eg.shape_relation("s0 >= 2", {"s0": s1}, where="a.py:4"),
            eg.shape_relation("s0 >= 3", {"s0": B}, where="a.py:5"),
            eg.shape_relation("s0 == s1", {"s0": B, "s1": s1}),
            eg.shape_relation("s1 == s0", {"s0": B, "s1": s1}),
        ]
    )
    assert [g.where for g in guards] == ["a.py:1", "a.py:4", "a.py:5", None, None]
    text = str(guards)
    assert "SHAPE_RELATION s0 >= 2  where s0 = x.size(0)  # a.py:1" in text
    assert "SHAPE_RELATION s0 >= 2  where s0 = y.size(0)  # a.py:4" in text
    assert "s1 == s0  where s1 = y.size(0), s0 = x.size(0)" in text


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("s0 + 1", "it is not a comparison"),
        ("s0 and s0 > 1", "it is not a comparison"),
        ("s0 >", "syntax error"),
        ("s0 > 1.5", "constant 1.5 is not an int"),
        ("s0 > True", "constant True is not an int"),
        ("s0 >= 'a'", "constant 'a' is not an int"),
        ("s0 / 2 > 1", "Div is not allowed"),
        ("s0.real > 1", "Attribute is not allowed"),
        ("s0[0] > 1", "Subscript is not allowed"),
        ("s9 > 1", "unknown name 's9'"),
        ("min > 1", "'min' is a function, not a symbol"),
        ("__import__('os') > 1", "call __import__('os') is not allowed"),
        ("min(s0) > 1", "call min(s0) is not allowed"),
        ("max(s0, key=s0) > 1", "is not allowed"),
        ("Eq(s0, 1, 2)", "call Eq(s0, 1, 2) is not allowed"),
        ("s0 ** s0 > 2", "only constant powers"),
        ("s0 ** 100 > 2", "only constant powers"),
        ("(lambda: 1)() > 0", "is not allowed"),
        ("s0 is 1", "IsNot is not allowed".replace("IsNot", "Is")),
        ("s0 in (1, 2)", "In is not allowed"),
        ("s0 if s0 else 1", "IfExp is not allowed"),
        ("1 > 0", "it uses no symbol"),
        ("s0 > 1; s0", "syntax error"),
        ("s0 & 1 == 0", "& | ~ only join comparisons"),
        ("~s0 > 1", "& | ~ only join comparisons"),
        ("Mod(s0, 2, 3) == 0", "is not allowed"),
    ],
)
def test_bad_expressions_are_value_errors_naming_them(expr: str, why: str) -> None:
    with pytest.raises(ValueError, match="bad shape relation") as info:
        eg.shape_relation(expr, {"s0": B})
    assert repr(expr) in str(info.value) and why in str(info.value)


def _sympy_relations() -> list[object]:
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    return [
        sympy.Eq(s0, 2 * s1), s0 >= 2, sympy.Ne(s0, 3), sympy.And(s0 >= 2, s1 < 5),
        sympy.Or(sympy.Eq(Mod(s0, 8), 0), s0 * s1 <= 64), sympy.Not(sympy.Eq(s0, 2)),
        sympy.Eq(FloorDiv(s0, 2), s1), sympy.Max(s0, s1) <= 10, sympy.Min(s0, s1) > 2,
        sympy.Eq(PythonMod(s0, 4), 0), s0**2 < 100, 2 * s0 - 3 * s1 + 1 > 0,
    ]  # fmt: skip


@pytest.mark.parametrize("relation", _sympy_relations(), ids=str)
def test_sympy_printed_relations_hold_exactly_when_sympy_says(relation: object) -> None:
    import sympy

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    c = compiled(eg.shape_relation(str(relation), {"s0": B, "s1": TensorSize(Y, 0)}))
    for a, b in itertools.product(range(1, 13), range(1, 13)):
        want = bool(relation.subs({s0: a, s1: b}))  # type: ignore[attr-defined]
        assert agree(c, torch.zeros(a), torch.zeros(b), 0)[0] is want, (relation, a, b)


def test_relation_guards_pickle_and_compare_equal() -> None:
    g = eg.shape_relation("Eq(s0, 2*s1)", {"s0": B, "s1": TensorSize(Y, 1)}, where="m.py:9")
    again = pickle.loads(pickle.dumps(g))
    assert again == g and again.key() == g.key() and again.where == "m.py:9"
    c = compiled(again)
    assert agree(c, torch.zeros(4), torch.zeros(3, 2), 0) == (True, None)


def test_bad_relation_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="is a str"):
        eg.shape_relation(b"s0 > 1", {"s0": B})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must map to a Source"):
        eg.shape_relation("s0 > 1", {"s0": "x.size(0)"})  # type: ignore[dict-item]


def test_each_size_is_fetched_once_for_many_relations() -> None:
    c = compiled(
        eg.tensor_match(X, torch.zeros(8), dynamic_sizes={0}),
        eg.shape_relation("s0 >= 2", {"s0": B}),
        eg.shape_relation("s0 % 2 == 0", {"s0": B}),
        eg.shape_relation("s0 <= n", {"s0": B, "n": N}),
    )
    assert c.source.count("(L_x, 0)") == 1
    assert agree(c, torch.zeros(8), 0, 8) == (True, None)
    assert agree(c, torch.zeros(6), 0, 4) == (
        False,
        "s0 <= n is false with s0 = 6 (x.size(0)), n = 4 (n)",
    )


def test_relation_guards_on_a_missing_or_odd_value_fail_without_raising() -> None:
    c = compiled(eg.shape_relation("s0 >= 2", {"s0": TensorSize(X, 3)}))
    ok, why = agree(c, torch.zeros(4), 0, 0)  # no dim 3
    assert ok is False and why is not None and why.startswith("x.size(3): IndexError")
    ok, why = agree(c, "not a tensor", 0, 0)
    assert ok is False and why is not None and why.startswith("x.size(3): TypeError")
    modulo = compiled(eg.shape_relation("n % s0 == 0", {"s0": Local("y"), "n": N}))
    ok, why = agree(modulo, 0, 0, 4)  # n % 0
    assert ok is False and why is not None and "ZeroDivisionError" in why


def test_relations_run_in_the_python_fallback_too(monkeypatch: pytest.MonkeyPatch) -> None:
    guards = [
        eg.tensor_match(X, torch.zeros(4, 3), dynamic_sizes={0}),
        eg.tensor_match(Y, torch.zeros(8, 3), dynamic_sizes={0}, dynamic_strides={1}),
        eg.shape_relation("s1 == 2*s0 and t1 == 1", {"s0": B, "s1": TensorSize(Y, 0),
                                                     "t1": TensorStride(Y, 1)}),
    ]  # fmt: skip
    cases = [
        (torch.zeros(4, 3), torch.zeros(8, 3)), (torch.zeros(5, 3), torch.zeros(10, 3)),
        (torch.zeros(5, 3), torch.zeros(9, 3)), (torch.zeros(5, 3), torch.zeros(3, 20).t()),
        (torch.zeros(5), torch.zeros(10, 3)), (torch.zeros(5, 3), torch.zeros(10, 6)[:, ::2]),
    ]  # fmt: skip
    fast = eg.GuardSet(guards).compile(FRAME)
    for name in ("size_at", "stride_at", "tensor_match", "tensors_match"):
        monkeypatch.setattr(_accel, name, getattr(_accel, f"py_{name}"))
    slow = eg.GuardSet(guards).compile(FRAME)
    assert "K" in slow.source and fast.source == slow.source
    results = [(agree(fast, x, y, 0), agree(slow, x, y, 0)) for x, y in cases]
    assert all(a == b for a, b in results)
    assert [a[0] for a, _ in results] == [True, True, False, False, False, False]


@pytest.mark.parametrize("mode", ["EMBER_GUARDS_PURE_PYTHON", "EMBER_GUARDS_NO_CXX"])
def test_fallback_modes_check_relations(mode: str) -> None:
    code = """if True:
        import torch, ember.guards as eg
        assert not eg.TENSOR_MATCH_CXX
        x = eg.Local("x")
        guards = [eg.tensor_match(x, torch.zeros(4, 2), dynamic_sizes={0}),
                  eg.shape_relation("s0 >= 2", {"s0": eg.TensorSize(x, 0)})]
        g = eg.GuardSet(guards).compile(eg.FrameSpec("f", ("x",), {}, {}))
        assert g.check(torch.ones(9, 2)) and not g.check(torch.ones(9, 3))
        print(g.explain_failure(torch.ones(1, 2)))
    """
    env = {**os.environ, mode: "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "s0: 1 is not >= 2 (s0 = x.size(0))"


def test_relations_check_after_tensor_matches_and_before_storage_aliasing() -> None:
    t = torch.zeros(4)
    guards = eg.GuardSet(
        [
            eg.storage_aliasing([X, Y], [t, torch.zeros(4)]),
            eg.shape_relation("s0 >= 2", {"s0": B}),
            eg.tensor_match(X, t, dynamic_sizes={0}),
            eg.shape_relation("n >= 0", {"n": N}),
        ]
    )
    kinds = [g.kind.name for g in guards]
    assert kinds == ["TENSOR_MATCH", "SHAPE_RELATION", "SHAPE_RELATION", "STORAGE_ALIASING"]
    assert guards.guards[1].source == N  # shallow sources first within the tier


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(0, 40),
    b2=st.integers(0, 90),
    n=st.integers(-5, 50),
)
def test_compiled_relations_match_an_oracle(b: int, b2: int, n: int) -> None:
    c = compiled(
        eg.tensor_match(X, torch.zeros(8, 2), dynamic_sizes={0}),
        eg.tensor_match(Y, torch.zeros(16, 2), dynamic_sizes={0}),
        eg.shape_relation("s0 >= 2", {"s0": B}),
        eg.shape_relation("s1 == 2*s0", {"s0": B, "s1": TensorSize(Y, 0)}),
        eg.shape_relation("(n % 4) == 0 and min(n, s0) <= 32", {"n": N, "s0": B}),
    )
    want = b >= 2 and b2 == 2 * b and n % 4 == 0 and min(n, b) <= 32
    ok, why = agree(c, torch.zeros(b, 2), torch.zeros(b2, 2), n)
    assert ok is want
    assert (why is None) is want
