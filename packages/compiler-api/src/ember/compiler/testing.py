"""Helpers for testing code compiled with ember.

>>> import torch, ember.compiler
>>> counter = CompileCounter()
>>> f = ember.compiler.compile(lambda x: torch.relu(x) * 2, backend=counter)
>>> _ = f(torch.ones(3)); _ = f(torch.ones(3))
>>> counter.frame_count, counter.op_count
(1, 2)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "TOLERANCES",
    "CompileCounter",
    "assert_same",
    "check_like_eager",
    "outcome",
    "tolerance",
]

# How far a compiled float result may be from eager's, as (rtol, atol) for
# torch.testing.assert_close: |got - want| <= atol + rtol * |want|. docs/correctness.md
# explains them; assert_same and the fuzzers use exactly these. Every other dtype (integers,
# bool) must be exact, and NaN must be NaN in both.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """The ``rtol``/``atol`` keywords for comparing results of ``dtype`` (see TOLERANCES).

    >>> tolerance(torch.float32)
    {'rtol': 1.3e-06, 'atol': 1e-05}
    >>> tolerance(torch.int64)
    {'rtol': 0.0, 'atol': 0.0}
    """
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return {"rtol": rtol, "atol": atol}


class CompileCounter:
    """A backend that counts the graphs (frames) and ops it is handed, then runs them eagerly.

    ``graphs`` keeps every GraphModule received, in order, for tests to inspect.

    >>> counter = CompileCounter()
    >>> counter.frame_count, counter.op_count, counter.graphs
    (0, 0, [])
    """

    def __init__(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
    ) -> Callable[..., Any]:
        self.frame_count += 1
        self.op_count += sum(
            n.op in ("call_function", "call_method") and n.target is not operator.getitem
            for n in gm.graph.nodes
        )
        self.graphs.append(gm)
        return gm.forward

    def clear(self) -> None:
        """Forget what was counted."""
        self.frame_count = self.op_count = 0
        self.graphs.clear()


def assert_same(got: Any, want: Any) -> None:
    """Assert a compiled result equals eager's: tensors with ``torch.testing.assert_close``,
    tuples, lists and dicts item by item (same type, length, keys in order), anything else
    with ``==``.

    >>> assert_same((torch.ones(2), {"n": 1}), (torch.ones(2), {"n": 1}))
    >>> assert_same([1], (1,))
    Traceback (most recent call last):
    AssertionError: ([1], (1,))
    """
    assert type(got) is type(want), (got, want)
    if isinstance(want, torch.Tensor):
        rtol, atol = TOLERANCES.get(want.dtype, (0.0, 0.0))
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    elif isinstance(want, tuple | list):
        assert len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want), (got, want)
        for key in want:
            assert_same(got[key], want[key])
    else:
        assert got == want, (got, want)


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``("value", fn(*args))``, or ``("raise", (type, message))`` if it raises.

    >>> outcome(int, "12"), outcome(int, "x")[0]
    (('value', 12), 'raise')
    """
    try:
        return "value", fn(*args)
    except Exception as e:  # compared by type and message
        return "raise", (type(e), str(e))


def check_like_eager(
    fn: Callable[..., Any], *args: Any, graphs: int | None = 1, backend: Any = None
) -> Any:
    """Run ``fn`` eagerly and compiled on ``args``: the same value (:func:`assert_same`) or
    the same exception type and message. With ``graphs`` (and the default counting
    backend) that many graphs with no break; ``graphs=1`` compiles with ``fullgraph=True``.
    Returns the compiled function.

    >>> compiled = check_like_eager(lambda x: torch.relu(x) * 2, torch.ones(2))
    >>> compiled.stats.graphs
    1
    """
    import ember.compiler

    want = outcome(fn, *args)
    counter = CompileCounter()
    compiled = ember.compiler.compile(fn, backend=backend or counter, fullgraph=graphs == 1)
    got = outcome(compiled, *args)
    assert got[0] == want[0], (got, want)
    assert_same(got[1], want[1])
    if graphs is not None and backend is None:
        assert counter.frame_count == graphs, (counter.frame_count, graphs)
        assert compiled.stats.breaks == [] and compiled.stats.failures == []
    return compiled
