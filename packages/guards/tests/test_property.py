"""Property: a guard set accepts exactly the calls whose guarded facts are unchanged.

Hypothesis draws a tensor description and Python constants, builds the
guards from them, then perturbs some of the facts (or none) and checks that
the compiled check passes exactly when nothing the guards cover changed. The
oracle below is written against torch's public API, independently of
``ember.guards``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ember.guards as eg
from ember.guards import _accel
from ember.guards.specs import TensorSpec

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "sparse"]


@dataclass(frozen=True)
class TensorDesc:
    """Enough to build a tensor with chosen metadata."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str
    requires_grad: bool
    parameter: bool
    inference: bool
    view_bit: str  # "", "conj", "neg"
    device: str

    def build(self) -> torch.Tensor:
        with torch.inference_mode() if self.inference else contextlib.nullcontext():
            t = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            t = _LAYOUT[self.layout](t)
            if self.view_bit == "conj" and t.dtype.is_complex:
                t = t.conj()
            elif self.view_bit == "neg" and t.layout is torch.strided and self.device == "cpu":
                t = torch._neg_view(t)
        grad = self.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)
        grad = grad and not self.inference and t.is_leaf
        if self.parameter and not self.inference:
            return torch.nn.Parameter(t.detach(), requires_grad=grad)
        return t.requires_grad_(grad) if grad else t


_LAYOUT: dict[str, Any] = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.t() if t.dim() == 2 else t,
    "sliced": lambda t: t[..., ::2] if t.dim() >= 1 else t,
    "expanded": lambda t: t[..., :1].expand(t.shape) if t.dim() >= 1 and t.shape[-1] > 0 else t,
    "sparse": lambda t: t.to_sparse() if t.device.type == "cpu" and t.dim() >= 1 else t,
}

descs = st.builds(
    TensorDesc,
    shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    requires_grad=st.booleans(),
    parameter=st.booleans(),
    inference=st.booleans(),
    view_bit=st.sampled_from(["", "conj", "neg"]),
    device=st.sampled_from(["cpu", "cpu", "meta"]),
)

scalars = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 0.5, float("nan"), float("inf")]),
    st.booleans(),
    st.sampled_from(["", "relu", "gelu"]),
    st.none(),
    st.sampled_from([torch.float32, torch.float16]),
    st.sampled_from([torch.device("cpu"), torch.device("meta")]),
)
constants = st.recursive(
    scalars,
    lambda inner: st.one_of(st.tuples(inner, inner), st.lists(inner, max_size=2)),
    max_leaves=4,
)


def facts(t: torch.Tensor) -> tuple[object, ...]:
    """The oracle: every fact a tensor match covers, via torch's public API."""
    strided = t.layout is torch.strided
    return (
        type(t), t.dtype, t.device, t.layout, tuple(t.shape), t.stride() if strided else None,
        t.requires_grad, t.is_inference(), t.is_conj() if t.dtype.is_complex else None, t.is_neg(),
    )  # fmt: skip


def same_constant(a: object, b: object) -> bool:
    """The oracle for constants: same types all the way down, same values
    (nan equals nan, 0.0 and -0.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(map(same_constant, a, b))  # type: ignore[arg-type]
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


def fresh(value: object) -> object:
    """An equal copy that is not the same object."""
    if isinstance(value, list):
        return [fresh(item) for item in value]
    if isinstance(value, tuple):
        return tuple(fresh(item) for item in value)
    return value


@contextlib.contextmanager
def torch_state(change: str) -> Iterator[None]:
    contexts = {
        "": contextlib.nullcontext,
        "no_grad": torch.no_grad,
        "autocast": lambda: torch.autocast("cpu"),
        "backend": lambda: eg.backend_scope("other"),
    }
    with contexts[change]():
        yield


def _frame(*args: object) -> None:
    return None


FRAME = eg.FrameSpec("frame", ("t", "k"), {}, {})


def guards_for(t: torch.Tensor, k: object) -> eg.CompiledGuards:
    guards = [eg.tensor_match(eg.Local("t"), t), eg.equals(eg.Local("k"), k)]
    return eg.GuardSet([*guards, *eg.global_state(), eg.backend("eager")]).compile(FRAME)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=descs,
    changed=st.one_of(st.none(), descs),
    fields=st.sets(st.sampled_from(list(TensorDesc.__dataclass_fields__))),
    k=constants,
    k_changed=st.one_of(st.none(), constants),
    state=st.sampled_from(["", "", "no_grad", "autocast", "backend"]),
)
def test_guards_accept_exactly_the_unchanged_calls(
    base: TensorDesc,
    changed: TensorDesc | None,
    fields: set[str],
    k: object,
    k_changed: object,
    state: str,
) -> None:
    t = base.build()
    with eg.backend_scope("eager"):
        compiled = guards_for(t, k)
    # Perturb: copy the chosen fields of another description onto the base one.
    desc = base if changed is None else replace(base, **{f: getattr(changed, f) for f in fields})
    t2, k2 = desc.build(), fresh(k) if k_changed is None else k_changed
    unchanged = facts(t2) == facts(t) and same_constant(k, k2) and state == ""
    event(f"unchanged={unchanged}")
    with eg.backend_scope("eager"), torch_state(state):
        assert compiled.check(t2, k2) is unchanged
        assert (compiled.explain_failure(t2, k2) is None) is unchanged
    packed = _accel.pack_tensor(TensorSpec.of(t))
    assert _accel.py_tensor_match(packed, t2) is _accel.tensor_match(packed, t2)
    assert _accel.tensor_match(packed, t2) is (facts(t2) == facts(t))


@settings(max_examples=100, deadline=None)
@given(a=constants, b=constants)
def test_equals_matches_the_strict_oracle(a: object, b: object) -> None:
    compiled = eg.GuardSet([eg.equals(eg.Local("k"), a)]).compile(eg.FrameSpec("f", ("k",), {}, {}))
    assert compiled.check(b) is same_constant(a, b)
    assert compiled.check(fresh(a)) is True
