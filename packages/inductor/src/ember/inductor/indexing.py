"""Index simplification: ``floor`` and ``Mod`` of loop variables, proved away with loop bounds.

Views, reshapes and fusion across different loop cuts write an element's address as
``floor``/``Mod`` of flat positions. Most of those divisions cannot change anything inside
the loop that runs them: ``Mod(i1, 8)`` is ``i1`` when ``i1 < 8``. :func:`simplify_index`
proves such facts from the bounds of each loop variable and drops the division, so the
generated C++ indexes with additions and multiplications only.

Bounds may be symbolic sizes (``ks0``: a positive integer known only at run time), so every
fact is proved for all their values: a range end is a polynomial in the sizes, and
:func:`nonnegative` proves ``p >= 0`` for every size ``>= 1`` (enough: sizes 0 and 1
specialise before a graph is symbolic, and a proof for ``>= 1`` covers them anyway).

>>> ks0 = sympy.Symbol("ks0", integer=True, positive=True)
>>> x1, y0 = sympy.symbols("x1 y0", integer=True, nonnegative=True)
>>> simplify_index(sympy.Mod(x1 + sympy.floor(y0 / ks0), ks0), {x1: ks0, y0: ks0})
x1
>>> simplify_index(sympy.floor((y0 + ks0 * x1) / ks0**2), {x1: ks0, y0: ks0})
0
"""

from __future__ import annotations

import functools
from typing import Any

import sympy  # type: ignore[import-untyped]

__all__ = ["nonnegative", "simplify_index"]

Bounds = dict[sympy.Symbol, Any]  # loop variable -> its size (int or sympy expression)
Interval = tuple[sympy.Expr, sympy.Expr]


def _size_symbol(s: sympy.Expr) -> bool:
    """A symbol that stands for a size: a positive integer (ember.inductor.symbolic)."""
    return bool(s.is_Symbol and s.is_integer and s.is_positive)


@functools.lru_cache(maxsize=4096)
def nonnegative(e: sympy.Expr, least: int = 1) -> bool:
    """True when ``e >= 0`` is proved for every value of its sizes (each ``>= least``);
    False when it is not proved (it may still hold).

    Each size ``s`` is written ``least + u`` with ``u >= 0``: a polynomial in the ``u``
    whose coefficients are all ``>= 0`` is ``>= 0``. (The lowering's size symbols are all
    ``>= 2``: sizes 0 and 1 specialise, :func:`ember.inductor.symbolic.size_vars`.)

    >>> ks0, ks1 = sympy.symbols("ks0 ks1", integer=True, positive=True)
    >>> nonnegative(ks0 * ks1 - ks0), nonnegative(ks0 - 2), nonnegative(ks0 - 2, least=2)
    (True, False, True)
    """
    e = sympy.expand(e)
    if e.is_Number:
        return bool(e >= 0)
    num, den = sympy.fraction(sympy.together(e))
    if den != 1:  # a fraction of sizes: >= 0 when its numerator is and its denominator > 0
        return nonnegative(sympy.expand(num), least) and nonnegative(sympy.expand(den) - 1, least)
    sizes = e.free_symbols
    if not all(_size_symbol(s) for s in sizes):
        return False
    shifted = sympy.expand(e.xreplace({s: s + least for s in sizes}))
    try:
        coeffs = sympy.Poly(shifted, *sizes).coeffs()
    except sympy.PolynomialError:
        return False  # floor, Mod or a fraction of sizes: not decided here
    return all(c.is_Number and c >= 0 for c in coeffs)


def _less(a: sympy.Expr, b: sympy.Expr) -> bool:
    """``v < b`` proved for every integer ``v <= a`` (``b`` an integer, ``a`` an integer or a
    fraction of sizes: the upper end of a range of ``floor``)."""
    num, den = sympy.fraction(sympy.together(b - a))
    if den == 1:
        return nonnegative(num - 1)  # integers: b - a >= 1
    return nonnegative(sympy.expand(num) - 1) and nonnegative(sympy.expand(den) - 1)  # > 0


def _range(e: sympy.Expr, bounds: Bounds) -> Interval | None:
    """Lowest and highest value of ``e`` over the loop box ``bounds`` (interval arithmetic,
    the ends in terms of the sizes), or None when not known."""
    if e.is_Number:
        return e, e
    if e.is_Symbol and e in bounds:
        return sympy.Integer(0), sympy.sympify(bounds[e]) - 1
    if all(_size_symbol(s) and s not in bounds for s in e.free_symbols):
        return e, e  # the same everywhere in the loops (a size, ``1/ks0``)
    rule = _RANGE_RULES.get(type(e))
    return None if rule is None else rule(e, bounds)


def _range_add(e: sympy.Add, bounds: Bounds) -> Interval | None:
    parts = [_range(a, bounds) for a in e.args]
    if any(p is None for p in parts):
        return None
    return sympy.Add(*[p[0] for p in parts]), sympy.Add(*[p[1] for p in parts])  # type: ignore[index]


def _range_mul(e: sympy.Mul, bounds: Bounds) -> Interval | None:
    c, rest = e.as_coeff_Mul()
    lo, hi = sympy.Integer(1), sympy.Integer(1)
    for factor in sympy.Mul.make_args(rest):
        r = _range(factor, bounds)
        if r is None or not nonnegative(r[0]):
            return None  # a product of non-negative ranges is monotone; others are not
        lo, hi = lo * r[0], hi * r[1]
    return (c * lo, c * hi) if c >= 0 else (c * hi, c * lo)


def _range_pow(e: sympy.Pow, bounds: Bounds) -> Interval | None:
    base, p = e.args
    r = _range(base, bounds)
    if r is None or not (p.is_Integer and p > 0 and nonnegative(r[0])):
        return None
    return r[0] ** p, r[1] ** p


def _range_floor(e: sympy.floor, bounds: Bounds) -> Interval | None:
    """``floor(x)`` lies in ``[floor(lo), floor(hi)]``; an end that is a fraction of sizes
    stays one (``x - 1 < floor(x) <= x``), which :func:`_less` and :func:`nonnegative` read."""
    r = _range(e.args[0], bounds)
    if r is None:
        return None
    lo, hi = r
    return (sympy.floor(lo) if lo.is_Number else lo - 1), (sympy.floor(hi) if hi.is_Number else hi)


def _range_mod(e: sympy.Mod, bounds: Bounds) -> Interval | None:
    x, n = e.args
    if n.free_symbols & set(bounds) or not nonnegative(n - 1):
        return None
    r = _range(x, bounds)
    if r is not None and nonnegative(r[0]) and _less(r[1], n):
        return r
    return sympy.Integer(0), n - 1


def _range_minmax(e: sympy.Min | sympy.Max, bounds: Bounds) -> Interval | None:
    parts = [_range(a, bounds) for a in e.args]
    if any(p is None or not (p[0].is_Number and p[1].is_Number) for p in parts):
        return None
    pick = min if isinstance(e, sympy.Min) else max
    return pick(p[0] for p in parts), pick(p[1] for p in parts)  # type: ignore[index]


_RANGE_RULES: dict[type, Any] = {
    sympy.Add: _range_add,
    sympy.Mul: _range_mul,
    sympy.Pow: _range_pow,
    sympy.floor: _range_floor,
    sympy.Mod: _range_mod,
    sympy.Min: _range_minmax,
    sympy.Max: _range_minmax,
}


def _whole(q: sympy.Expr) -> bool:
    """``q`` (a term divided by a divisor) is an integer for every value of its symbols."""
    den = sympy.fraction(q)[1]
    return bool(den == 1 and q.as_coeff_Mul()[0].is_Integer)


def _size(n: sympy.Expr) -> int:
    """How large a divisor looks (its degree, then its coefficient): the larger is tried first."""
    k, rest = n.as_coeff_Mul()
    return (sympy.Poly(rest).total_degree() if rest.free_symbols else 0, abs(int(k)))  # type: ignore[return-value]


def _split(num: sympy.Expr, den: sympy.Expr, bounds: Bounds) -> tuple[sympy.Expr, ...] | None:
    """``num = g*q + r`` with ``0 <= r < g`` and ``g`` dividing ``den``, or None.

    ``g`` is tried among ``den`` and the common factors of ``den`` with each term of ``num``,
    largest first; ``q`` gathers the terms that ``g`` divides."""
    terms = sympy.Add.make_args(sympy.expand(num))
    candidates = {den}
    for t in terms:
        try:
            candidates.add(sympy.gcd(t, den))
        except sympy.PolynomialError:
            continue
    for g in sorted(candidates - {1}, key=_size, reverse=True):
        if not nonnegative(g - 1):
            continue
        quotients = [sympy.cancel(t / g) for t in terms]
        whole = [_whole(q) for q in quotients]
        rest = sympy.Add(*[t for t, w in zip(terms, whole, strict=True) if not w])
        r = _range(rest, bounds)
        if r is not None and nonnegative(r[0]) and _less(r[1], g):
            q = sympy.Add(*[q for q, w in zip(quotients, whole, strict=True) if w])
            return g, q, rest
    return None


def _simplify_mod(x: sympy.Expr, n: sympy.Expr, bounds: Bounds) -> sympy.Expr:
    r = _range(x, bounds)
    if r is not None and nonnegative(r[0]) and _less(r[1], n):
        return x  # cannot wrap
    if not n.free_symbols & set(bounds) and nonnegative(n - 1):
        split = _split(x, n, bounds)
        if split is not None:  # g*q + r mod g*c == g*(q mod c) + r when 0 <= r < g
            g, q, rest = split
            return g * sympy.Mod(q, sympy.cancel(n / g)) + rest
    return sympy.Mod(x, n)


def _simplify_floor(x: sympy.Expr, bounds: Bounds) -> sympy.Expr:
    r = _range(x, bounds)
    if r is not None and sympy.floor(r[0]) == sympy.floor(r[1]):
        return sympy.floor(r[0])
    num, den = sympy.fraction(sympy.together(x))
    if den != 1 and not den.free_symbols & set(bounds) and nonnegative(den - 1):
        split = _split(num, den, bounds)
        if split is not None:  # floor((g*q + r)/(g*c)) == floor(q/c) when 0 <= r < g
            g, q, _ = split
            return sympy.floor(q / sympy.cancel(den / g))
    return sympy.floor(x)


def simplify_index(e: sympy.Expr, bounds: Bounds) -> sympy.Expr:
    """Drop or shrink ``Mod``/``floor`` using the loop bounds: values that cannot wrap
    (``Mod(i1, 8) -> i1`` when ``i1 < 8``) and low terms that cannot carry
    (``floor((512*x0 + y0)/32768) -> floor(x0/64)`` when ``y0 < 512``). A bound may be a
    symbolic size; every rewrite is proved for all its values.

    >>> x0, y0 = sympy.symbols("x0 y0", integer=True, nonnegative=True)
    >>> simplify_index(sympy.floor((512 * x0 + y0) / 32768), {x0: 256, y0: 512})
    floor(x0/64)
    """
    if not e.has(sympy.floor, sympy.Mod):
        return e
    key = tuple(sorted(((v, sympy.sympify(n)) for v, n in bounds.items()), key=str))
    return _simplified(e, key)


@functools.lru_cache(maxsize=16384)
def _simplified(e: sympy.Expr, key: tuple[tuple[sympy.Symbol, sympy.Expr], ...]) -> sympy.Expr:
    # A split index put back together first (``n*floor(x/n) + Mod(x, n)`` is ``x`` for any
    # ``n``, no bound needed): a view's index of a flattened symbolic dimension is mostly
    # that, and proving the floor and Mod away one at a time with symbolic bounds cost
    # 3-12 ms each in sympy (hf-t5-infer's six: 38 ms against 9.5 ms static).
    e = _recombine(e)
    if not e.has(sympy.floor, sympy.Mod):
        return e
    bounds = dict(key)
    for _ in range(6):
        new = e.replace(sympy.floor, lambda x: _simplify_floor(x, bounds))
        new = new.replace(sympy.Mod, lambda x, n: _simplify_mod(x, n, bounds))
        new = _recombine(sympy.expand(new))
        if new == e:
            break
        e = new
    return e


def _recombine(e: sympy.Expr) -> sympy.Expr:
    """``a*Mod(x, n) + a*n*floor(x/n) -> a*x`` (a split index put back together; ``a`` and
    ``n`` may be sizes)."""
    terms: dict[sympy.Expr, sympy.Expr] = {}  # a Mod or floor (or 1) -> its multiplier
    for t in sympy.Add.make_args(e):
        atoms = [f for f in sympy.Mul.make_args(t) if isinstance(f, sympy.Mod | sympy.floor)]
        atom = atoms[0] if len(atoms) == 1 else sympy.Integer(1)
        terms[atom] = terms.get(atom, 0) + t / atom
    for term, a in list(terms.items()):
        if not isinstance(term, sympy.Mod) or term not in terms:
            continue
        x, n = term.args
        whole = sympy.floor(x / n)
        if whole in terms and sympy.expand(terms[whole] - a * n) == 0:
            del terms[term], terms[whole]
            terms[sympy.Integer(1)] = terms.get(sympy.Integer(1), 0) + a * x
    return sympy.expand(sympy.Add(*[c * t for t, c in terms.items()]))
