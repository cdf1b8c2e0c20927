"""Stamps: a check that skips guards while nothing they read changed must answer exactly as
the full check does, whatever changes."""

from __future__ import annotations

import gc
import random
import sys
import types
import weakref

import pytest
import torch

from ember.guards import (
    FrameSpec,
    GuardSet,
    Local,
    equals,
    id_match,
    is_none,
    module_state,
    settings,
    type_match,
)
from ember.guards import stamps as st
from ember.guards.sources import (
    Attr,
    Cell,
    Computed,
    Default,
    GenericAttr,
    Item,
    ModuleChild,
    ModuleGlobal,
    has_generic_attribute,
)

pytestmark = pytest.mark.skipif(st.stamps_match is None or st._native is None, reason="no C")


@pytest.fixture(autouse=True)
def _small_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st.StampState, "MINIMUM", 1)


class Config:
    """A config whose ``__getattribute__`` maps names, then reads past itself."""

    attribute_map = {"hidden": "d_model"}

    def __init__(self) -> None:
        self.d_model = 8
        self.use_cache = False

    def __getattribute__(self, key: str) -> object:
        if key != "attribute_map" and key in object.__getattribute__(self, "attribute_map"):
            key = object.__getattribute__(self, "attribute_map")[key]
        return object.__getattribute__(self, key)


class Block(torch.nn.Module):
    scale = 2.0

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.eps = 1e-5
        self.mode = "fast"
        self.config = Config()
        self.table = {"a": 1, "b": (2, 3)}


def helper(x: object, k: int = 3, *, flag: bool = True) -> object:
    return x


def _frame(cells: dict[str, types.CellType] | None = None) -> FrameSpec:
    return FrameSpec("f", ("m",), {}, {}, cells=cells or {})


def _sources(m: Block) -> list:  # type: ignore[type-arg]
    """Guards of every stampable step kind, all true for a fresh Block."""
    self = Local("m")
    lin = ModuleChild(self, "lin")
    config = Attr(self, "config")
    return [
        id_match(self, m),
        equals(Attr(self, "eps"), 1e-5),
        equals(Attr(self, "mode"), "fast"),
        equals(Attr(self, "scale"), 2.0),  # a class attribute
        type_match(lin, m.lin),
        equals(Attr(lin, "in_features"), 2),
        module_state(lin, m.lin),
        equals(GenericAttr(config, "d_model"), 8),
        equals(GenericAttr(config, "use_cache"), False),
        equals(Computed(has_generic_attribute, (config, "missing")), False),
        equals(Computed(hasattr, (lin, "missing")), False),
        equals(Computed(hasattr, (lin, "weight")), True),
        equals(Item(Attr(self, "table"), "a"), 1),
        equals(Item(Item(Attr(self, "table"), "b"), 1), 3),
        equals(Default(ModuleGlobal(__name__, "helper"), 0), 3),
        equals(Default(ModuleGlobal(__name__, "helper"), "flag"), True),
        id_match(Attr(ModuleGlobal(__name__, "helper"), "__code__"), helper.__code__),
        equals(ModuleGlobal("math", "pi"), 3.141592653589793),
    ]


def _pair(guards: list, frame: FrameSpec):  # type: ignore[no-untyped-def,type-arg]
    stamped = GuardSet(guards).compile(frame)
    with settings.section.patch(stamps=False):
        full = GuardSet(guards).compile(frame)
    assert stamped.stamps is not None and full.stamps is None
    return stamped, full


def _warm(compiled, *args: object) -> None:  # type: ignore[no-untyped-def]
    """Three passes: the second records the program, the third runs on it."""
    assert compiled.check(*args) and compiled.check(*args) and compiled.check(*args)
    assert st.stamps_match(compiled.stamps.slot[0])


def test_every_step_kind_is_covered() -> None:
    m = Block()
    stamped, _ = _pair(_sources(m), _frame())
    _warm(stamped, m)
    covered = {str(g.source) for g in stamped.stamps.stamped}
    assert "m.eps" in covered and "m.scale" in covered and "m.lin" in covered
    assert "object.__getattribute__(m.config, 'd_model')" in covered
    assert "M['math'].pi" in covered
    assert len(stamped.stamps.stamped) == len(_sources(m)) - 1  # all but the pin itself
    hits = st._native.stamps_hits(stamped.stamps.slot[0])
    stamped.check(m)
    assert st._native.stamps_hits(stamped.stamps.slot[0]) == hits + 1


MUTATIONS = {
    "eps changed": lambda m: setattr(m, "eps", 1e-6),
    "eps equal, another object": lambda m: setattr(m, "eps", float("1e-5")),
    "unrelated attribute set": lambda m: setattr(m, "other", 1),
    "eps deleted": lambda m: delattr(m, "eps"),
    "eps shadowed class value": lambda m: setattr(m, "scale", 3.0),
    "class value changed": lambda m: setattr(Block, "scale", 5.0),
    "base class changed": lambda m: setattr(torch.nn.Module, "scale", 7.0),
    "submodule swapped": lambda m: setattr(m, "lin", torch.nn.Linear(2, 2)),
    "submodule of another class": lambda m: setattr(m, "lin", torch.nn.Bilinear(2, 2, 2)),
    "in_features changed": lambda m: setattr(m.lin, "in_features", 3),
    "training toggled": lambda m: m.lin.train(False),
    "hook added": lambda m: m.lin.register_forward_hook(lambda *a: None),
    "buffer appears": lambda m: m.lin.register_buffer("missing", torch.zeros(1)),
    "submodule appears": lambda m: m.lin.add_module("missing", torch.nn.ReLU()),
    "parameter removed": lambda m: m.lin._parameters.pop("weight"),
    "config value changed": lambda m: setattr(m.config, "d_model", 16),
    "config attribute appears": lambda m: setattr(m.config, "missing", 1),
    "config dict replaced": lambda m: setattr(m.config, "__dict__", {"d_model": 8}),
    "table item changed": lambda m: m.table.__setitem__("a", 2),
    "nested tuple replaced": lambda m: m.table.__setitem__("b", (2, 4)),
    "instance dict replaced": lambda m: setattr(m, "__dict__", dict(m.__dict__, eps=1.0)),
    "class of the instance changed": lambda m: setattr(
        m, "__class__", type("B2", (Block,), {"scale": 9.0})
    ),
    "class changed, same values": lambda m: setattr(m, "__class__", type("B3", (Block,), {})),
    "default changed": lambda m: setattr(helper, "__defaults__", (4,)),
    "kwdefault changed": lambda m: setattr(helper, "__kwdefaults__", {"flag": False}),
    "code swapped": lambda m: setattr(helper, "__code__", _frame.__code__),
    "global rebound": lambda m: setattr(sys.modules[__name__], "helper", lambda x: x),
    "math.pi changed": lambda m: setattr(sys.modules["math"], "pi", 3.0),
}


#: mutations after which every guard still holds (the check must pass, on a new program)
SAME = (
    "eps equal, another object",
    "unrelated attribute set",
    "submodule swapped",
    "base class changed",
    "class changed, same values",
)


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_change_answers_as_the_full_check(name: str) -> None:
    m = Block()
    saved = (
        dict(Block.__dict__),
        helper.__defaults__,
        dict(helper.__kwdefaults__ or {}),
        helper.__code__,
        sys.modules["math"].pi,
    )
    try:
        stamped, full = _pair(_sources(m), _frame())
        _warm(stamped, m)
        MUTATIONS[name](m)
        want = full.check(m)
        assert stamped.check(m) is want
        assert stamped.check(m) is want  # again: on a new program where the check passed
        if name in SAME:
            assert want is True
        else:
            assert want is False
    finally:
        for key in ("scale",):
            setattr(Block, key, saved[0][key])
        if "scale" in torch.nn.Module.__dict__:
            del torch.nn.Module.scale
        helper.__defaults__, helper.__code__ = saved[1], saved[3]
        helper.__kwdefaults__ = saved[2]
        sys.modules[__name__].helper = helper  # type: ignore[attr-defined]
        sys.modules["math"].pi = saved[4]


def test_a_cell_that_changes() -> None:
    cell = types.CellType(10)
    frame = _frame({"n": cell})
    m = Block()
    stamped, full = _pair([id_match(Local("m"), m), equals(Cell("n"), 10)], frame)
    _warm(stamped, m)
    cell.cell_contents = 11
    assert stamped.check(m) is full.check(m) is False
    cell.cell_contents = 10
    assert stamped.check(m) is full.check(m) is True


def test_a_dict_written_every_call_is_read_key_by_key() -> None:
    m = Block()
    m.state = {"compiling": False, "value": None}
    guards = [id_match(Local("m"), m), equals(Item(Attr(Local("m"), "state"), "compiling"), False)]
    stamped, full = _pair(guards, _frame())
    for _ in range(6):  # the code sets and resets an entry on every call
        assert stamped.check(m)
        m.state["value"] = object()
        m.state["value"] = None
    state = stamped.stamps
    assert state.volatile and st.stamps_match(state.slot[0]) and not state.off
    m.state["value"] = 5  # the key the guards do not read: still on the program
    assert st.stamps_match(state.slot[0])
    m.state["compiling"] = True
    assert stamped.check(m) is full.check(m) is False


def test_a_pin_to_another_object_fails() -> None:
    m, other = Block(), Block()
    stamped, _ = _pair(_sources(m), _frame())
    _warm(stamped, m)
    assert stamped.check(other) is False


def test_stamps_keep_no_model_alive() -> None:
    m = Block()
    stamped, _ = _pair(_sources(m), _frame())
    _warm(stamped, m)
    ref = weakref.ref(m)
    lin = weakref.ref(m.lin)
    del m
    gc.collect()
    assert ref() is None and lin() is None
    assert not st.stamps_match(stamped.stamps.slot[0])  # the root's weakref is dead


def test_stamps_turn_off_when_they_keep_failing() -> None:
    m = Block()
    guards = [id_match(Local("m"), m), is_none(Attr(Local("m"), "nothing"))]
    m.nothing = None
    stamped, _ = _pair(guards, _frame())
    for _ in range(12):  # a new dict every call: versions never repeat, nor do dicts' ids
        m.__dict__ = dict(m.__dict__)
        assert stamped.check(m)
    assert stamped.stamps.off and stamped.stamps.slot[0] is None
    assert stamped.check(m)


def test_a_property_is_left_to_the_full_check() -> None:
    class WithProperty(Block):
        @property
        def computed(self) -> int:
            return len(self.mode)

    m = WithProperty()
    others = [g for g in _sources(m) if "mode" not in str(g.source)]
    guards = [*others, equals(Attr(Local("m"), "computed"), 4)]
    stamped, _ = _pair(guards, _frame())
    _warm(stamped, m)
    assert "m.computed" not in {str(g.source) for g in stamped.stamps.stamped}
    m.mode = "slow"  # the property's value changes through a dict the guard never names
    assert stamped.check(m) is True  # "slow" has 4 letters too
    m.mode = "quick"
    assert stamped.check(m) is False


def test_random_changes_against_the_full_check() -> None:
    """A fuzzer: random mutations (many of which restore the value), compared on every step."""
    rng = random.Random(0)
    m = Block()
    stamped, full = _pair(_sources(m), _frame())
    values = {"eps": [1e-5, 1e-6], "mode": ["fast", "slow"], "scale": [2.0, 3.0]}
    mismatches = fast = held = 0
    for step in range(600):
        what = rng.randrange(60)  # one step in ten changes something
        if what == 0:
            name = rng.choice(list(values))
            setattr(m, name, rng.choice(values[name]))
        elif what == 1 and "scale" in m.__dict__:
            del m.scale
        elif what == 2:
            m.config.d_model = rng.choice([8, 8, 16])
        elif what == 3:
            m.table["a"] = rng.choice([1, 1, 2])
        elif what == 4:
            m.lin.train(rng.random() < 0.7)
        elif what == 5:
            m.unrelated = step
        fast += bool(st.stamps_match(stamped.stamps.slot[0]))
        want = full.check(m)
        held += want
        mismatches += stamped.check(m) is not want
    assert mismatches == 0
    assert fast > held // 2, (fast, held)  # the fast path ran on most calls that passed


def test_a_change_during_the_walk_keeps_no_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk reads values after the check passed; one changed in between (by another
    thread) must not be written into a program the next calls trust."""
    m = Block()
    stamped, full = _pair(_sources(m), _frame())
    real = st._Walk.__init__

    def changed_meanwhile(walk, *args):  # type: ignore[no-untyped-def]
        m.eps = 1e-6  # after the check passed, before the walk reads anything
        real(walk, *args)

    assert stamped.check(m)  # first pass: nothing recorded
    monkeypatch.setattr(st._Walk, "__init__", changed_meanwhile)
    assert stamped.check(m)  # this call's check passed before the change
    monkeypatch.setattr(st._Walk, "__init__", real)
    assert stamped.stamps.slot[0] is None  # nothing kept: the check after the walk failed
    assert stamped.check(m) is full.check(m) is False
