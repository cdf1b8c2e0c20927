"""Kernels over symbolic sizes: one loop body over a range of the outer loops, run by one thread
or split among threads per call.

A static kernel knows its work when it is written, so it is parallel or not once and for all.
A kernel over symbolic sizes learns its work per call. Its ``extern "C"`` function therefore
compares the work with the parallel threshold and either calls the body over all outer
points or opens a ``#pragma omp parallel`` region in which each thread calls the body over
its share of them (split as OpenMP's static schedule splits a loop). The body is a plain
``static`` function taking the kernel's ``__restrict__`` pointers and the range ``[lo, hi)``
of the outer loops collapsed into one index: it is written and compiled once (a serial and
a parallel copy doubled the source and the build), and it is no OpenMP-outlined function,
whose loops read the pointers from a struct and ran up to 1.3x slower. An ``if(...)``
clause on one parallel loop would also be one body, but costs about 1 us a call when off.

>>> head, loop, step = range_nest([("x0", "ks0", 1), ("x1", "ks1", 1)])
>>> print("\\n".join([*head, loop, "  ...", "  " + step, "}"]))
int64_t x1 = lo % ks1;
int64_t x0 = lo / ks1;
for (int64_t xr = lo; xr < hi; ++xr) {
  ...
  if (++x1 == ks1) { x1 = 0; ++x0; }
}
"""

from __future__ import annotations

__all__ = ["SHARE_CPP", "count", "dispatcher", "range_nest"]

#: Helpers a translation unit with ranged kernels needs (inserted after the prelude).
SHARE_CPP = r"""#include <omp.h>
// [lo, hi): this thread's share of n iterations, cut as OpenMP's static schedule cuts a loop
static inline void ember_share(int64_t n, int64_t& lo, int64_t& hi) {
  const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t q = n / nt, r = n % nt;
  lo = t * q + (t < r ? t : r);
  hi = lo + q + (t < r ? 1 : 0);
}
"""

# a loop of the nest: its variable, its bound (a C++ expression) and its step
Loop = tuple[str, str, int]


def count(loop: Loop) -> str:
    """How many iterations a loop makes, as C++.

    >>> count(("xb", "ks0", 16)), count(("x0", "ks0", 1))
    ('((ks0 + 15) / 16)', 'ks0')
    """
    _, bound, step = loop
    return bound if step == 1 else f"(({bound} + {step - 1}) / {step})"


def range_nest(loops: list[Loop]) -> tuple[list[str], str, str]:
    """The loops of ``loops`` (outermost first) collapsed into one over ``[lo, hi)``: lines
    setting each variable at ``lo``, the loop's first line, and the statement ending each
    iteration, which advances the variables as an odometer (no division per iteration).

    >>> range_nest([("x0", "(4 * ks0)", 1), ("xb", "ks1", 16)])
    (['int64_t xb = (lo % ((ks1 + 15) / 16)) * 16;', 'int64_t x0 = lo / ((ks1 + 15) / 16);'], \
'for (int64_t xr = lo; xr < hi; ++xr) {', 'if ((xb += 16) >= ks1) { xb = 0; ++x0; }')
    >>> range_nest([("x0", "ks0", 1)])
    ([], 'for (int64_t x0 = lo; x0 < hi; ++x0) {', '')
    """
    if len(loops) == 1 and loops[0][2] == 1:  # the range is the loop's own
        var = loops[0][0]
        return [], f"for (int64_t {var} = lo; {var} < hi; ++{var}) {{", ""
    head, rest = [], "lo"
    for k in range(len(loops) - 1, -1, -1):
        var, _, step = loops[k]
        at = rest if k == 0 else f"{rest} % {count(loops[k])}"
        head.append(f"int64_t {var} = {at if step == 1 else f'({at}) * {step}'};")
        rest = f"{rest} / {count(loops[k])}"
    advance = ""
    for k, (var, bound, step) in enumerate(loops):
        bump = f"++{var}" if step == 1 else f"{var} += {step}"
        if k == 0:
            advance = f"{bump};"
            continue
        test = f"++{var} == {bound}" if step == 1 else f"({var} += {step}) >= {bound}"
        advance = f"if ({test}) {{ {var} = 0; {advance} }}"
    return head, "for (int64_t xr = lo; xr < hi; ++xr) {", advance


def dispatcher(
    signature: str, body: str, args: list[str], n: str, work: str, limit: int, threads: str
) -> str:
    """The ``extern "C"`` function of a ranged kernel: ``signature`` is its first line, ``body``
    the name of its range function called with ``args`` then ``lo, hi``, ``n`` the number of
    outer points, ``work`` the elements it computes, and ``threads`` the clause of its region.

    >>> print(dispatcher("void k(int64_t s) {", "k_r", ["s"], "s", "(8 * s)", 100, ""))
    void k(int64_t s) {
      const int64_t n = s;
      if ((8 * s) < 100 || n < 2) { k_r(s, 0, n); return; }
      #pragma omp parallel
      {
        int64_t lo, hi;
        ember_share(n, lo, hi);
        k_r(s, lo, hi);
      }
    }
    <BLANKLINE>
    """
    call = ", ".join(args)
    return (
        f"{signature}\n"
        f"  const int64_t n = {n};\n"
        f"  if ({work} < {limit} || n < 2) {{ {body}({call}, 0, n); return; }}\n"
        f"  #pragma omp parallel{threads}\n"
        "  {\n"
        "    int64_t lo, hi;\n"
        "    ember_share(n, lo, hi);\n"
        f"    {body}({call}, lo, hi);\n"
        "  }\n"
        "}\n"
    )
