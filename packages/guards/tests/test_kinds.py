"""Every guard kind passing and failing, and the words of each failure."""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch

import ember.guards as eg
from ember.guards import (
    Attr,
    Global,
    GuardKind,
    GuardSet,
    Local,
    ModuleChild,
    TorchState,
)

FRAME = eg.FrameSpec("f", ("x", "y"), {"CONFIG": types.SimpleNamespace(eps=0.1)}, {})


def compiled(*guards: eg.Guard) -> eg.CompiledGuards:
    return GuardSet(guards).compile(FRAME)


def verdict(guards: eg.CompiledGuards, *args: object) -> tuple[bool, str | None]:
    """The check's answer and the explanation, which must agree."""
    ok = guards.check(*args)
    why = guards.explain_failure(*args)
    assert ok is (why is None), (ok, why)
    return ok, why


def test_every_kind_has_a_rule() -> None:
    assert set(eg.KINDS) == set(GuardKind)


def test_type_match() -> None:
    g = compiled(eg.type_match(Local("x"), 1.0))
    assert verdict(g, 2.5, None) == (True, None)
    assert verdict(g, 2, None) == (False, "x: type expected float, got int")


def test_id_match() -> None:
    net, other = torch.nn.ReLU(), torch.nn.ReLU()
    g = compiled(eg.id_match(Local("x"), net))
    assert verdict(g, net, None) == (True, None)
    ok, why = verdict(g, other, None)
    assert not ok and why is not None and why.startswith("x: expected the ReLU object at 0x")


@pytest.mark.parametrize(
    ("expected", "same", "different", "message"),
    [
        (3, 3, 4, "x: expected 3, got 4"),
        (3, 3, 3.0, "x: expected 3 (int), got 3.0 (float)"),
        (1, 1, True, "x: expected 1 (int), got True (bool)"),
        (True, True, 1, "x: expected True (bool), got 1 (int)"),
        (0.5, 0.5, 0.25, "x: expected 0.5, got 0.25"),
        (0.0, 0.0, -0.0, "x: expected 0.0, got -0.0"),
        (float("nan"), float("nan"), 1.0, "x: expected nan, got 1.0"),
        (float("inf"), float("inf"), float("-inf"), "x: expected inf, got -inf"),
        ("relu", "re" + "lu", "gelu", "x: expected 'relu', got 'gelu'"),
        (None, None, 0, "x: expected None, got 0"),
        (torch.float32, torch.float32, torch.half, "x: expected torch.float32, got torch.float16"),
        (torch.device("cpu"), torch.device("cpu"), torch.device("meta"),
         "x: expected device(type='cpu'), got device(type='meta')"),
        ((1, 2), (1, 2), (1, 2.0), "x: expected (1, 2), got (1, 2.0)"),
        ([1], [1], (1,), "x: expected [1], got (1,)"),
        ([1, (2, "a")], [1, (2, "a")], [1, (2,)], "x: expected [1, (2, 'a')], got [1, (2,)]"),
        ((), (), (None,), "x: expected (), got (None,)"),
    ],
)  # fmt: skip
def test_equals(expected: object, same: object, different: object, message: str) -> None:
    g = compiled(eg.equals(Local("x"), expected))
    assert verdict(g, same, None) == (True, None)
    assert verdict(g, different, None) == (False, message)


def test_equals_rejects_non_constants() -> None:
    with pytest.raises(TypeError, match="EQUALS needs a constant"):
        eg.equals(Local("x"), {"a": 1})


def test_length() -> None:
    g = compiled(eg.length(Local("x"), [1, 2]))
    assert verdict(g, (5, 6), None) == (True, None)
    assert verdict(g, [1], None) == (False, "x: length expected 2, got 1")


def test_dict_keys_same_keys_same_order() -> None:
    g = compiled(eg.dict_keys(Local("x"), {"a": 1, "b": 2}))
    assert verdict(g, {"a": 0, "b": 0}, None) == (True, None)
    assert verdict(g, {"b": 0, "a": 0}, None) == (
        False,
        "x: keys expected ['a', 'b'], got ['b', 'a']",
    )
    assert verdict(g, {"a": 0}, None)[0] is False
    assert verdict(g, ["a", "b"], None) == (False, "x: expected a dict, got list")


def test_dict_keys_with_non_str_keys_checks_key_types() -> None:
    g = compiled(eg.dict_keys(Local("x"), {1: "a"}))
    assert verdict(g, {1: "b"}, None) == (True, None)
    assert verdict(g, {True: "b"}, None)[0] is False


def test_is_none_and_not_none() -> None:
    g = compiled(eg.is_none(Local("x")), eg.not_none(Local("y")))
    assert verdict(g, None, 0) == (True, None)
    assert verdict(g, 0, 0) == (False, "x: expected None, got int")
    assert verdict(g, None, None) == (False, "y: expected not None, got None")


def test_same_tensor_and_no_aliasing() -> None:
    a, b = torch.zeros(2), torch.zeros(2)
    same = compiled(eg.same_tensor(Local("x"), Local("y")))
    assert verdict(same, a, a) == (True, None)
    assert verdict(same, a, b) == (False, "x: expected the same tensor as y, got another")
    distinct = compiled(eg.no_aliasing(Local("x"), Local("y")))
    assert verdict(distinct, a, b) == (True, None)
    assert verdict(distinct, a, a) == (False, "x: expected distinct tensors, got x is y")


def test_storage_aliasing() -> None:
    base, other = torch.zeros(6), torch.zeros(6)
    g = compiled(eg.storage_aliasing([Local("x"), Local("y")], [base, base[2:]]))
    assert verdict(g, base, base[2:]) == (True, None)
    assert verdict(g, other, other[2:]) == (True, None)  # another storage, the same relation
    changed = "x: storage sharing changed: y expected"
    assert verdict(g, base, other) == (False, f"{changed} the storage of x, got its own")
    assert verdict(g, base, base[1:]) == (False, "x: storage offset of y expected 2, got 1")
    assert verdict(g, base, 1.0)[0] is False
    apart = compiled(eg.storage_aliasing([Local("x"), Local("y")], [base, other]))
    assert verdict(apart, base, other) == (True, None)
    assert verdict(apart, base, base) == (False, f"{changed} its own storage, got that of x")
    assert verdict(apart, base, base.view(2, 3))[0] is False


@pytest.mark.parametrize(
    ("field", "context", "message"),
    [
        ("grad_mode", torch.no_grad, "grad mode: expected enabled, got disabled"),
        ("inference_mode", lambda: _both(torch.inference_mode(), torch.enable_grad()),
         "inference mode: expected disabled, got enabled"),
        ("autocast", lambda: torch.autocast("cpu"),
         "autocast: expected disabled, got enabled for cpu (torch.bfloat16)"),
        ("deterministic", lambda: _deterministic(),
         "deterministic algorithms: expected disabled, got enabled"),
        ("default_dtype", lambda: _default_dtype(torch.float64),
         "default dtype: expected torch.float32, got torch.float64"),
        ("torch_function", lambda: _Mode(),
         "torch function: expected enabled, no modes, got enabled, _Mode"),
        ("torch_function", torch._C.DisableTorchFunctionSubclass,
         "torch function: expected enabled, no modes, got subclasses disabled, no modes"),
        ("module_hooks", lambda: _global_hook(),
         "global module hooks: expected no global module hooks, got 1 global module hooks"),
    ],
)  # fmt: skip
def test_global_state(field: str, context: object, message: str) -> None:
    g = compiled(*eg.global_state())
    assert verdict(g, None, None) == (True, None)
    with context():  # type: ignore[operator]
        assert verdict(g, None, None) == (False, message)
    assert verdict(g, None, None) == (True, None)
    assert any(guard.source == TorchState(field) for guard in g.guards)


def test_global_state_guard_made_in_a_non_default_state() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16), _deterministic():
        g = compiled(*eg.global_state())
        assert verdict(g, None, None) == (True, None)
    assert verdict(g, None, None) == (
        False,
        "autocast: expected enabled for cpu (torch.bfloat16), got disabled",
    )
    with torch.autocast("cpu", dtype=torch.float16), _deterministic():
        assert verdict(g, None, None)[1] == (
            "autocast: expected enabled for cpu (torch.bfloat16), "
            "got enabled for cpu (torch.float16)"
        )


def test_module_state() -> None:
    net = torch.nn.Linear(2, 2)
    g = compiled(eg.module_state(Local("x"), net))
    assert verdict(g, net, None) == (True, None)
    net.eval()
    assert verdict(g, net, None) == (False, "x: training expected True, got False")
    net.train()
    handle = net.register_forward_hook(lambda *args: None)
    ok, why = verdict(g, net, None)
    assert not ok and why == f"x: forward hooks expected ids [], got [{handle.id}]"
    handle.remove()
    assert verdict(g, net, None) == (True, None)
    assert verdict(g, object(), None)[0] is False


def test_module_state_with_hooks_at_compile_time() -> None:
    net = torch.nn.Linear(2, 2)
    handle = net.register_forward_pre_hook(lambda *args: None)
    g = compiled(eg.module_state(Local("x"), net))
    assert verdict(g, net, None) == (True, None)
    handle.remove()
    assert verdict(g, net, None) == (
        False,
        f"x: forward pre-hooks expected ids [{handle.id}], got []",
    )


def test_backend() -> None:
    g = compiled(eg.backend("eager"))
    with eg.backend_scope("eager"):
        assert verdict(g, None, None) == (True, None)
    with eg.backend_scope("inductor"):
        assert verdict(g, None, None) == (False, "backend: expected 'eager', got 'inductor'")
    assert verdict(g, None, None) == (False, "backend: expected 'eager', got None")


def test_backend_callable_compared_by_identity() -> None:
    def mine(gm: object, inputs: object) -> object:
        return gm

    g = compiled(eg.backend(mine))
    with eg.backend_scope(mine):
        assert verdict(g, None, None) == (True, None)
    with eg.backend_scope(lambda gm, inputs: gm):
        assert verdict(g, None, None)[0] is False


def test_weakref_alive() -> None:
    class Box:
        pass

    box = Box()
    g = compiled(eg.weakref_alive(Local("x"), box))
    assert verdict(g, None, None) == (True, None)
    del box
    gc.collect()
    assert verdict(g, None, None) == (False, "x: weakly referenced object is dead")


SPARSE = "x: layout expected torch.strided, got torch.sparse_coo"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda: torch.zeros(12, 4), "x: size[0] expected 8, got 12"),
        (lambda: torch.zeros(8, 4, 1), "x: size expected (8, 4), got (8, 4, 1)"),
        (lambda: torch.zeros(8, 4).double(), "x: dtype expected torch.float32, got torch.float64"),
        (lambda: torch.zeros(8, 4, device="meta"), "x: device expected cpu, got meta"),
        (lambda: torch.zeros(4, 8).t(), "x: stride[0] expected 4, got 1"),
        (lambda: torch.ones(8, 4).requires_grad_(), "x: requires_grad expected False, got True"),
        (lambda: _inference(torch.zeros(8, 4)), "x: inference tensor expected False, got True"),
        (lambda: torch._neg_view(torch.zeros(8, 4)), "x: negative bit expected False, got True"),
        (lambda: torch.nn.Parameter(torch.zeros(8, 4)), "x: type expected Tensor, got Parameter"),
        (lambda: torch.ones(8, 4).to_sparse(), SPARSE),
        (lambda: [0.0] * 8, "x: type expected Tensor, got list"),
    ],
)  # fmt: skip
def test_tensor_match(change: object, message: str) -> None:
    g = compiled(eg.tensor_match(Local("x"), torch.zeros(8, 4)))
    assert verdict(g, torch.ones(8, 4), None) == (True, None)
    assert verdict(g, torch.ones(8, 8)[:, :4].contiguous(), None) == (True, None)
    assert verdict(g, change(), None) == (False, message)  # type: ignore[operator]


def test_tensor_match_conjugate_bit_of_complex_tensors() -> None:
    z = torch.zeros(3, dtype=torch.complex64)
    g = compiled(eg.tensor_match(Local("x"), z))
    assert verdict(g, z.clone(), None) == (True, None)
    assert verdict(g, z.conj(), None) == (False, "x: conjugate bit expected False, got True")


def test_tensor_match_other_facts() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    g = compiled(eg.tensor_match(Local("x"), p))
    assert verdict(g, torch.nn.Parameter(torch.ones(3)), None) == (True, None)
    assert verdict(g, torch.nn.Parameter(torch.ones(3), requires_grad=False), None)[1] == (
        "x: requires_grad expected True, got False"
    )
    meta = compiled(eg.tensor_match(Local("x"), torch.zeros(2, device="meta")))
    assert verdict(meta, torch.ones(2, device="meta"), None) == (True, None)
    assert verdict(meta, torch.ones(2), None) == (False, "x: device expected meta, got cpu")


def test_tensor_guard_made_on_inference_tensor() -> None:
    g = compiled(eg.tensor_match(Local("x"), _inference(torch.zeros(2))))
    assert verdict(g, _inference(torch.ones(2)), None) == (True, None)
    assert verdict(g, torch.ones(2), None) == (
        False,
        "x: inference tensor expected True, got False",
    )


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_tensor_match_rejects_tensors_without_sizes() -> None:
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ValueError, match="cannot guard"):
        eg.tensor_match(Local("x"), nested)
    g = compiled(eg.tensor_match(Local("x"), torch.zeros(2)))
    assert verdict(g, nested, None)[0] is False


def test_guards_through_sources() -> None:
    frame = eg.FrameSpec.from_function(_forward)
    net = _Net()
    guards = GuardSet(
        [
            eg.equals(Attr(Global("CONFIG"), "eps"), 0.1),
            eg.tensor_match(ModuleChild(Local("self"), "weight", eg.PARAMETERS), net.weight),
            eg.module_state(ModuleChild(Local("self"), "inner"), net.inner),
        ]
    ).compile(frame)
    assert verdict(guards, net, torch.zeros(2)) == (True, None)
    net.inner.eval()
    assert verdict(guards, net, torch.zeros(2)) == (
        False,
        "self.inner: training expected True, got False",
    )
    net.inner.train()
    net.weight = torch.nn.Parameter(torch.zeros(5))
    assert verdict(guards, net, torch.zeros(2)) == (False, "self.weight: size[0] expected 3, got 5")
    CONFIG.eps = 0.2
    try:
        assert verdict(guards, net, torch.zeros(2)) == (
            False,
            "G['CONFIG'].eps: expected 0.1, got 0.2",
        )
    finally:
        CONFIG.eps = 0.1


# --- helpers ----------------------------------------------------------------

CONFIG = types.SimpleNamespace(eps=0.1)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(3))
        self.inner = torch.nn.ReLU()


def _forward(self: _Net, x: torch.Tensor) -> torch.Tensor:
    return x * CONFIG.eps


def _inference(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


class _State:
    """A context manager from enter/exit callables."""

    def __init__(self, enter: object, exit: object) -> None:
        self._enter, self._exit = enter, exit

    def __enter__(self) -> None:
        self._enter()  # type: ignore[operator]

    def __exit__(self, *exc: object) -> None:
        self._exit()  # type: ignore[operator]


def _both(first: object, second: object) -> _State:
    return _State(
        lambda: (first.__enter__(), second.__enter__()),  # type: ignore[attr-defined]
        lambda: (second.__exit__(None, None, None), first.__exit__(None, None, None)),  # type: ignore[attr-defined]
    )


def _deterministic() -> _State:
    return _State(
        lambda: torch.use_deterministic_algorithms(True),
        lambda: torch.use_deterministic_algorithms(False),
    )


def _default_dtype(dtype: torch.dtype) -> _State:
    old = torch.get_default_dtype()
    return _State(lambda: torch.set_default_dtype(dtype), lambda: torch.set_default_dtype(old))


def _global_hook() -> _State:
    handles: list[torch.utils.hooks.RemovableHandle] = []
    hook = torch.nn.modules.module.register_module_forward_hook
    return _State(
        lambda: handles.append(hook(lambda *args: None)),
        lambda: handles.pop().remove(),
    )


_ = weakref  # imported for readers: WEAKREF_ALIVE holds a weakref.ref


def test_id_match_holds_its_object_weakly_and_fails_once_it_dies():
    import gc
    import weakref

    from ember.guards import FrameSpec, GuardSet, Local, WeakIdentity, id_match

    class Owner:
        pass

    owner = Owner()
    alive = weakref.ref(owner)
    guard = id_match(Local("o"), owner)
    assert isinstance(guard.expected, WeakIdentity)
    compiled = GuardSet([guard]).compile(FrameSpec("f", ("o",), {}, {}))
    assert compiled.check(owner) and not compiled.check(Owner())
    del owner
    gc.collect()
    assert alive() is None, "the compiled check must not keep the object alive"
    assert not compiled.check(Owner())
    assert "since deleted" in (compiled.explain_failure(Owner()) or "")
