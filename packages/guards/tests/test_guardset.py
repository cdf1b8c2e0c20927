"""GuardSet: dedupe, order, printing, compiling, sources, and odd objects."""

from __future__ import annotations

import expecttest
import pytest
import torch

import ember.guards as eg
from ember.guards import (
    Attr,
    Cell,
    Default,
    Global,
    GuardKind,
    GuardSet,
    Item,
    Local,
    ModuleChild,
    TensorAttr,
    TypeOf,
)


def test_deduplicates_keeping_the_first_where() -> None:
    guards = GuardSet(
        [
            eg.equals(Local("k"), 1, where="a.py:1"),
            eg.equals(Local("k"), 1, where="a.py:2"),
            eg.equals(Local("k"), True),
            eg.equals(Local("k"), float("nan")),
            eg.equals(Local("k"), float("nan")),
            eg.tensor_match(Local("x"), torch.zeros(2)),
            eg.tensor_match(Local("x"), torch.ones(2)),
        ]
    )
    assert len(guards) == 4
    assert [g.where for g in guards if g.expected == 1 and g.expected is not True] == ["a.py:1"]


def test_union() -> None:
    a = GuardSet([eg.is_none(Local("x"))])
    assert len(a | GuardSet([eg.is_none(Local("x")), eg.is_none(Local("y"))])) == 2


def test_order_state_first_bases_before_attributes_tensors_last() -> None:
    guards = GuardSet(
        [
            eg.tensor_match(Local("x"), torch.zeros(2)),
            eg.equals(Attr(Attr(Local("cfg"), "inner"), "eps"), 0.1),
            eg.type_match(Attr(Local("cfg"), "inner"), object()),
            eg.module_state(Local("m"), torch.nn.ReLU()),
            eg.type_match(Local("cfg"), object()),
            eg.equals(Local("k"), 1),
            eg.tensor_match(ModuleChild(Local("m"), "w", eg.PARAMETERS), torch.zeros(1)),
            eg.backend("eager"),
            *eg.global_state()[:1],
        ]
    )
    assert [str(g.source) for g in guards] == [
        "backend", "grad mode", "k", "cfg", "cfg.inner", "cfg.inner.eps", "m", "x", "m.w",
    ]  # fmt: skip


class TestPrinting(expecttest.TestCase):
    def test_str_lists_every_guard_with_source_and_location(self) -> None:
        guards = GuardSet(
            [
                eg.tensor_match(Local("x"), torch.nn.Parameter(torch.zeros(8))),
                eg.equals(Attr(Global("config"), "eps"), 1e-5, where="m.py:4"),
                eg.type_match(Item(Local("args"), 0), 1),
                eg.dict_keys(Local("kwargs"), {"a": 1}),
                eg.length(Local("args"), (1, 2)),
                eg.is_none(Cell("mask"), where="m.py:9"),
                eg.not_none(Default(Global("helper"), 0)),
                eg.no_aliasing(Local("x"), Local("y")),
                eg.same_tensor(Local("y"), Local("z")),
                eg.module_state(Local("self"), torch.nn.ReLU().eval()),
                eg.backend("inductor"),
                *eg.global_state()[:2],
            ]
        )
        self.assertExpectedInline(
            str(guards),
            """\
GuardSet of 13 guards:
  BACKEND       backend == 'inductor'
  GLOBAL_STATE  grad mode == enabled
  GLOBAL_STATE  inference mode == disabled
  IS_NONE       C['mask'] is None  # m.py:9
  LENGTH        len(args) == 2
  DICT_KEYS     list(kwargs) == ['a']
  SAME_TENSOR   y is z
  NO_ALIASING   x, y are distinct objects
  EQUALS        G['config'].eps == 1e-05  # m.py:4
  TYPE_MATCH    type(args[0]) is int
  NOT_NONE      G['helper'].__defaults__[0] is not None
  MODULE_STATE  self: eval, no hooks
  TENSOR_MATCH  x: Parameter(torch.float32, cpu, size=(8,), stride=(1,), requires_grad=True)""",
        )

    def test_generated_check_source(self) -> None:
        frame = eg.FrameSpec("f", ("x", "k"), {"config": None}, {"len": len})
        guards = GuardSet(
            [
                eg.equals(Attr(Global("config"), "eps"), 1e-5),
                eg.id_match(Global("len"), len),
                eg.equals(Local("k"), -0.0),
                eg.tensor_match(Local("x"), torch.zeros(2)),
            ]
        ).compile(frame)
        self.assertExpectedInline(
            guards.source,
            """\
def __make(K0, G, B, K1, K2, K3):
    def check_f(L_x, L_k, /):
        try:
            if not (type(L_k) is float and L_k == 0.0 and K0(1.0, L_k) == -1.0): return False
            v0 = (G['len'] if 'len' in G else B['len'])
            if not (v0 is K1()): return False
            v1 = G['config']
            v2 = v1.eps
            if not (type(v2) is float and v2 == 1e-05): return False
            if not (K3(K2, L_x)): return False
        except Exception:
            return False
        return True
    return check_f""",
        )


def _all_slots(a, b=1, *rest, k, opt=None, **options):  # type: ignore[no-untyped-def]
    return a


def test_check_takes_every_argument_slot_in_co_varnames_order() -> None:
    frame = eg.FrameSpec.from_function(_all_slots)
    assert frame.arg_names == ("a", "b", "k", "opt", "rest", "options")
    assert eg.arg_count(_all_slots.__code__) == 6
    guards = GuardSet(
        [
            eg.equals(Local("a"), 1),
            eg.length(Local("rest"), (1,)),
            eg.dict_keys(Local("options"), {"z": 0}),
            eg.equals(Item(Local("options"), "z"), 0),
            eg.is_none(Local("opt")),
        ]
    ).compile(frame)
    assert guards.check(1, 2, 3, None, (9,), {"z": 0})
    assert not guards.check(1, 2, 3, None, (9,), {"z": 1})
    with pytest.raises(TypeError):
        guards.check(1, 2, 3, None, (9,))


def test_odd_argument_names_are_renamed() -> None:
    frame = eg.FrameSpec("<listcomp>", (".0",), {}, {})
    guards = GuardSet([eg.type_match(Local(".0"), iter(()))]).compile(frame)
    assert guards.check(iter(()))
    assert guards.explain_failure(1) == ".0: type expected tuple_iterator, got int"


def test_compile_rejects_unknown_names() -> None:
    frame = eg.FrameSpec("f", ("x",), {}, {})
    with pytest.raises(ValueError, match="'y' is not an argument of f"):
        GuardSet([eg.is_none(Local("y"))]).compile(frame)
    with pytest.raises(ValueError, match="'n' is not a closure variable of f"):
        GuardSet([eg.is_none(Cell("n"))]).compile(frame)


def test_empty_guard_set_always_passes() -> None:
    compiled = GuardSet().compile(eg.FrameSpec("f", ("x",), {}, {}))
    assert compiled.check(object()) and compiled.explain_failure(1) is None


# --- sources ---------------------------------------------------------------


def test_source_names() -> None:
    layer = ModuleChild(ModuleChild(Local("self"), "layers"), "0")
    assert str(ModuleChild(layer, "weight", eg.PARAMETERS)) == "self.layers[0].weight"
    assert str(ModuleChild(layer, "running_mean", eg.BUFFERS)) == "self.layers[0].running_mean"
    assert str(Attr(Global("config"), "eps")) == "G['config'].eps"
    assert str(Item(Item(Local("args"), -1), "k")) == "args[-1]['k']"
    assert str(TensorAttr(Local("x"), "grad")) == "x.grad"
    assert str(TypeOf(Cell("n"))) == "type(C['n'])"
    assert str(Default(Global("g"), "eps")) == "G['g'].__kwdefaults__['eps']"


def test_source_validation() -> None:
    with pytest.raises(TypeError):
        Item(Local("x"), True)
    with pytest.raises(TypeError):
        Item(Local("x"), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TensorAttr(Local("x"), "weight")
    with pytest.raises(ValueError):
        eg.TorchState("nope")


def test_every_source_class_has_a_fetcher() -> None:
    classes = {cls for cls in vars(eg).values() if isinstance(cls, type) and cls is not eg.Source}
    sources = {cls for cls in classes if issubclass(cls, eg.Source)}
    assert sources == set(eg.sources.FETCHERS)


def _helper(x, scale=2.0, *, eps=1e-5):  # type: ignore[no-untyped-def]
    return x


def test_fetching_every_source() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    net.register_buffer("steps", torch.zeros(1))
    n = 3

    def fn(self, x, args):  # type: ignore[no-untyped-def]
        return n

    frame = eg.FrameSpec("fn", ("self", "x", "args"), {"helper": _helper}, {"len": len},
                         {"n": fn.__closure__[0]})  # type: ignore[index]  # fmt: skip
    t = torch.zeros(2, 3)
    cases = {
        Local("x"): t,
        Global("helper"): _helper,
        Global("len"): len,
        Cell("n"): 3,
        Attr(Local("self"), "training"): True,
        Item(Local("args"), 1): "b",
        ModuleChild(Local("self"), "0"): net[0],
        ModuleChild(ModuleChild(Local("self"), "0"), "bias", eg.PARAMETERS): net[0].bias,
        ModuleChild(Local("self"), "steps", eg.BUFFERS): net.steps,
        Default(Global("helper"), 0): 2.0,
        Default(Global("helper"), "eps"): 1e-5,
        TensorAttr(Local("x"), "shape"): (2, 3),
        Item(TensorAttr(Local("x"), "shape"), 1): 3,
        TypeOf(Local("x")): torch.Tensor,
        eg.TorchState("grad_mode"): True,
        eg.Backend(): None,
        eg.ModuleGlobal("torch.nn.functional", "torch"): torch,
        eg.ModuleGlobal("torch.nn.functional", "len"): len,
        eg.Computed(max, (Cell("n"), Item(TensorAttr(Local("x"), "shape"), 0), 1)): 3,
    }
    for source, expected in cases.items():
        compiled = GuardSet([eg.id_match(source, object())]).compile(frame)
        got = compiled._fetch(source, (net, t, ("a", "b")))
        assert got is expected or (not isinstance(got, torch.Tensor) and got == expected), source
    assert n == 3


def test_globals_follow_load_global_semantics() -> None:
    g: dict[str, object] = {}
    frame = eg.FrameSpec("f", (), g, {"len": len})
    compiled = GuardSet([eg.id_match(Global("len"), len)]).compile(frame)
    assert compiled.check()
    g["len"] = lambda x: 0  # a global now shadows the builtin
    assert not compiled.check()
    del g["len"]
    assert compiled.check()
    g["w"] = 1
    present = GuardSet([eg.equals(Global("w"), 1)]).compile(frame)
    assert present.check()
    del g["w"]
    assert not present.check()
    assert present.explain_failure() == "G['w']: KeyError: 'w'"


def test_closure_cells_are_read_at_check_time() -> None:
    fn = _closure(2)
    compiled = GuardSet([eg.equals(Cell("scale"), 2)]).compile(fn)
    assert compiled.check(1)
    fn.__closure__[0].cell_contents = 3  # type: ignore[index]  # as `nonlocal scale` would
    assert not compiled.check(1)
    assert compiled.explain_failure(1) == "C['scale']: expected 2, got 3"
    del fn.__closure__[0].cell_contents  # type: ignore[index]
    assert compiled.explain_failure(1) == "C['scale']: ValueError: Cell is empty"


def _closure(scale: int):  # type: ignore[no-untyped-def]
    def fn(x):  # type: ignore[no-untyped-def]
        return x * scale

    return fn


# --- odd objects never make the check raise ----------------------------------


class _RaisingGetattr:
    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"no {name} here")


class _RaisingEq:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    __hash__ = object.__hash__


class _RaisingLen:
    def __len__(self) -> int:
        raise RuntimeError("no length")


class _RaisingProperty:
    @property
    def eps(self) -> float:
        raise ZeroDivisionError("bad property")


class _RaisingTorchFunction(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("no torch function")


EPS = eg.equals(Attr(Local("x"), "eps"), 0.1)


@pytest.mark.parametrize(
    ("guard", "value", "message"),
    [
        (EPS, _RaisingGetattr(), "x.eps: RuntimeError: no eps here"),
        (EPS, _RaisingProperty(), "x.eps: ZeroDivisionError: bad property"),
        (EPS, object(), "x.eps: AttributeError: 'object' object has no attribute 'eps'"),
        (eg.equals(Item(Local("x"), "k"), 1), {}, "x['k']: KeyError: 'k'"),
        (eg.equals(Item(Local("x"), 3), 1), [0], "x[3]: IndexError: list index out of range"),
        (eg.equals(Local("x"), "a"), _RaisingEq(), "x: expected 'a', got <_RaisingEq>"),
        (eg.dict_keys(Local("x"), {"a": 1}), {_RaisingEq(): 1}, "x: RuntimeError: no comparing"),
        (eg.length(Local("x"), [1]), _RaisingLen(), "x: RuntimeError: no length"),
        (eg.tensor_match(Local("x"), torch.zeros(2)), _RaisingTorchFunction(),
         "x: type expected Tensor, got _RaisingTorchFunction"),
        (eg.module_state(Local("x"), torch.nn.ReLU()), _RaisingGetattr(), None),
    ],
    ids=["getattr", "property", "missing-attr", "missing-key", "missing-index", "eq", "keys-eq",
         "len", "torch-function", "module-getattr"],
)  # fmt: skip
def test_odd_objects_make_the_check_false_not_raise(
    guard: eg.Guard, value: object, message: str | None
) -> None:
    compiled = GuardSet([guard]).compile(eg.FrameSpec("f", ("x",), {}, {}))
    assert compiled.check(value) is False
    why = compiled.explain_failure(value)
    assert why is not None
    if message is not None and "<_RaisingEq>" not in message:
        assert why == message


def test_tensor_subclass_whose_torch_function_raises() -> None:
    odd = torch.zeros(2).as_subclass(_RaisingTorchFunction)
    with torch._C.DisableTorchFunctionSubclass():
        guard = eg.tensor_match(Local("x"), odd)
    compiled = GuardSet([guard]).compile(eg.FrameSpec("f", ("x",), {}, {}))
    # Never raises. The C++ matcher reads the tensor's real metadata without calling
    # __torch_function__ and accepts it; the Python getters raise, which fails the check.
    result = compiled.check(odd)
    assert result is eg.TENSOR_MATCH_CXX
    assert compiled.check(torch.zeros(3).as_subclass(_RaisingTorchFunction)) is False
    if not result:
        assert compiled.explain_failure(odd) is not None


def test_base_exceptions_propagate() -> None:
    class Interrupting:
        def __getattr__(self, name: str) -> object:
            raise KeyboardInterrupt

    compiled = GuardSet([eg.equals(Attr(Local("x"), "y"), 1)]).compile(
        eg.FrameSpec("f", ("x",), {}, {})
    )
    with pytest.raises(KeyboardInterrupt):
        compiled.check(Interrupting())


def test_guard_kinds_round_trip_through_str() -> None:
    assert {kind.value for kind in GuardKind} == {kind.name for kind in GuardKind}


def test_computed_sources_guard_a_condition_on_numbers() -> None:
    import operator

    frame = eg.FrameSpec("f", ("loss", "scale"), {}, {})
    above = eg.Computed(
        operator.gt, (eg.Computed(operator.mul, (Local("loss"), Local("scale"))), 1.0)
    )
    guards = GuardSet([eg.type_match(Local("loss"), 0.0), eg.equals(above, True)])
    assert [str(g.source) for g in guards.guards] == ["loss", "gt(mul(loss, scale), 1.0)"]
    compiled = guards.compile(frame)
    assert compiled.check(2.0, 1.0) and compiled.check(0.6, 2.0)
    assert not compiled.check(0.2, 2.0)
    assert not compiled.check("a", 2.0)  # the type guard fails first; nothing raises
    assert (
        compiled.explain_failure(0.2, 2.0) == "gt(mul(loss, scale), 1.0): expected True, got False"
    )
