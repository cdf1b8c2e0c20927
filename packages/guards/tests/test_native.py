"""The C accelerator and its pure-Python twins give the same answers."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import ember.guards as eg
from ember.guards import _accel
from ember.guards.specs import ModuleSpec, TensorSpec


def _inference(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


def tensors() -> list[object]:
    base = torch.arange(12.0).reshape(3, 4)
    z = torch.zeros(2, 2, dtype=torch.complex64)
    return [
        base, base.t(), base[:, ::2], base.expand(2, 3, 4), base.to(torch.float64),
        base.to(torch.int32), base.clone().requires_grad_(), base.clone().requires_grad_() * 2,
        torch.nn.Parameter(base.clone()), torch.nn.Parameter(base.clone(), requires_grad=False),
        _inference(base), z, z.conj(), torch._neg_view(base), base.to_sparse(),
        torch.zeros(3, 4, device="meta"), torch.zeros(()), torch.zeros(0, 4),
        torch.zeros(2, 1, 1, 1, 1, 1, 3), 3.0, None, "tensor",
    ]  # fmt: skip


@pytest.mark.skipif(bool(os.environ.get("EMBER_GUARDS_PURE_PYTHON")), reason="pure Python")
def test_native_is_built_here() -> None:
    message = "C accelerator not built: pip install --no-build-isolation -e packages/guards"
    assert eg.NATIVE, message
    assert _accel.tensor_match is not _accel.py_tensor_match


@pytest.mark.skipif(bool(os.environ.get("EMBER_GUARDS_PURE_PYTHON")), reason="pure Python")
def test_cxx_tensor_matcher_is_built_here() -> None:
    message = "C++ tensor matcher not built: torch must be importable while building ember-guards"
    assert _accel.TENSOR_MATCH_CXX, message
    assert _accel.tensor_match is _accel._CXX.tensor_match


def _tensor_matchers() -> list[object]:
    found = [m.tensor_match for m in (_accel._NATIVE, _accel._CXX) if m is not None]
    return [*found, _accel.tensor_match]


@pytest.mark.parametrize("matcher", _tensor_matchers(), ids=lambda m: getattr(m, "__module__", "?"))
def test_tensor_match_twins_agree(matcher) -> None:  # type: ignore[no-untyped-def]
    values = tensors()
    specs = [TensorSpec.of(t) for t in values if isinstance(t, torch.Tensor)]
    for spec, value in itertools.product(specs, values):
        packed = _accel.pack_tensor(spec)
        native, python = matcher(packed, value), _accel.py_tensor_match(packed, value)
        assert native is python, (spec, value)
        assert native is (eg.specs.tensor_mismatch(spec, value) is None), (spec, value)


def test_batched_tensor_match() -> None:
    a, b = torch.zeros(2), torch.zeros(3)
    specs = (_accel.pack_tensor(TensorSpec.of(a)), _accel.pack_tensor(TensorSpec.of(b)))
    for fn in (_accel.tensors_match, _accel.py_tensors_match):
        assert fn(specs, a, b) is True
        assert fn(specs, b, a) is False
        assert fn(()) is True
        with pytest.raises(TypeError):
            fn(specs, a)


def test_module_match_twins_agree() -> None:
    hooked = torch.nn.Linear(2, 2)
    hooked.register_forward_hook(lambda *args: None)
    fake = type("Fake", (), {"training": True})()
    modules = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).eval(), hooked, torch.nn.ReLU()]
    modules += [object(), 3, fake]
    specs = [ModuleSpec.of(m) for m in modules[:4]]  # type: ignore[arg-type]
    for spec, module in itertools.product(specs, modules):
        packed = _accel.pack_module(spec)
        native = _accel.module_match(packed, module)
        assert native is _accel.py_module_match(packed, module), (spec, module)
        assert native is (eg.specs.module_mismatch(spec, module) is None), (spec, module)
    packed_all = tuple(_accel.pack_module(s) for s in specs)
    assert _accel.modules_match(packed_all, *modules[:4]) is True
    assert _accel.py_modules_match(packed_all, *modules[:4]) is True


def test_distinct_twins_agree() -> None:
    a, b, c = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    for args in [(), (a,), (a, b, c), (a, b, a), (c, c)]:
        assert (
            _accel.distinct(*args)
            is _accel.py_distinct(*args)
            is (len({*map(id, args)}) == len(args))
        )


def test_malformed_specs_are_type_errors() -> None:
    with pytest.raises(TypeError):
        _accel.tensor_match((1, 2), torch.zeros(1))
    with pytest.raises(TypeError):
        _accel.module_match((True,), torch.nn.ReLU())


def test_subclass_overriding_shape_in_python_is_guarded_on_real_metadata() -> None:
    class Lying(torch.Tensor):
        @property
        def shape(self) -> torch.Size:  # type: ignore[override]
            return torch.Size([99])

    t = torch.zeros(2).as_subclass(Lying)
    packed = _accel.pack_tensor(TensorSpec.of(t))
    assert TensorSpec.of(t).size == (2,)
    assert _accel.tensor_match(packed, t) and _accel.py_tensor_match(packed, t)


def test_storage_groups_twins_agree() -> None:
    a, b = torch.zeros(6), torch.zeros(6)
    cases = [(a, b), (a, a), (a, a[1:]), (a, b, a[2:]), (a, b[1:], b[2:]), (a, torch.zeros(0))]
    for layout_of in cases:
        layout = _accel.storage_layout(layout_of)
        for args in cases:
            if len(args) != len(layout_of):
                continue
            want = _accel.storage_layout(args) == layout
            assert _accel.storage_groups(layout, *args) is want
            assert _accel.py_storage_groups(layout, *args) is want
    assert _accel.storage_groups(_accel.storage_layout((a, b)), a, "x") is False
    assert _accel.py_storage_groups(_accel.storage_layout((a, b)), a, "x") is False
