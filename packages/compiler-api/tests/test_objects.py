"""Python objects made inside compiled code: user classes, dataclasses, namedtuples.

They live in the translation's heap while tracing (no graph break) and are made for
real only when they outlive the graph: returned, stored, or alive at a break.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

import ember.compiler
from ember.compiler.testing import CompileCounter


class Affine:
    def __init__(self, w: torch.Tensor, b: float = 0.0) -> None:
        self.w = w
        self.b = b
        self.calls = 0

    @property
    def shifted(self) -> float:
        return self.b + 1

    def __call__(self, x):
        self.calls += 1
        return x * self.w + self.b


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    std: torch.Tensor
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    scale: float


class Out(typing.NamedTuple):
    value: torch.Tensor
    scale: float = 1.0

    def doubled(self):
        return self.value * 2


def _compiled(fn):
    counter = CompileCounter()
    return ember.compiler.compile(fn, backend=counter), counter


def test_an_instance_made_and_used_inside_is_one_graph():
    def f(x):
        layer = Affine(x.sum(), b=2.0)
        return layer(x) + layer.shifted

    compiled, counter = _compiled(f)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 1 and compiled.stats.breaks == []


def test_returned_instances_are_made_for_real_with_their_attributes_and_aliases():
    def f(x):
        s = Stats(x.mean(), x.std())
        s.tags.append("train")
        return s, s, Out(x + 1)

    compiled, _ = _compiled(f)
    x = torch.randn(5)
    s1, s2, out = compiled(x)
    assert s1 is s2 and isinstance(s1, Stats) and s1.tags == ["train"]
    torch.testing.assert_close(s1.mean, x.mean())
    assert isinstance(out, Out) and out.scale == 1.0
    torch.testing.assert_close(out.doubled(), (x + 1) * 2)
    assert compiled.stats.breaks == []


def test_an_instance_alive_at_a_break_reaches_the_resumed_code():
    def f(x):
        layer = Affine(x.max())
        print("break")
        return layer(x), layer.calls

    compiled, counter = _compiled(f)
    x = torch.randn(3)
    for _ in range(2):
        out, calls = compiled(x)
        torch.testing.assert_close(out, x * x.max())
        assert calls == 1
    assert counter.frame_count == 2 and len(compiled.stats.breaks) == 1


def test_assigning_to_a_frozen_dataclass_raises_as_in_eager():
    def f(x):
        fr = Frozen(2.0)
        fr.scale = 3.0
        return x * fr.scale

    compiled, _ = _compiled(f)
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled(torch.ones(2))


def test_a_frozen_dataclass_is_made_inside():
    def f(x):
        return x * Frozen(3.0).scale

    compiled, counter = _compiled(f)
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert counter.frame_count == 1 and compiled.stats.breaks == []


def test_sets_of_constants_are_built_inside():
    def f(x, n):
        s = {1, 2}
        s.add(n)
        t = set(range(3)) | s
        u = {i % 2 for i in range(5)}
        return x * len(s) + len(t) + len(u), s, 2 in s, t

    compiled, counter = _compiled(f)
    got, want = compiled(torch.ones(1), 3), f(torch.ones(1), 3)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] and counter.frame_count == 1 and compiled.stats.breaks == []
