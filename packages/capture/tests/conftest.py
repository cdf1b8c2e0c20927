"""Helpers shared by capture's tests of its fake-tensor shortcuts (test_fakeview.py,
test_fakepointwise.py): random cases over a fresh symbolic fake mode. The folder is put on
``sys.path`` for ``fakecheck`` (helpers the tests import; pytest's importlib mode adds no
folder)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ember.capture.fakememo import TracerFakeMode

sys.path.insert(0, str(Path(__file__).parent))

Case = tuple[random.Random, TracerFakeMode, list[int]]
RandomCases = Callable[..., Iterator[Case]]


def _random_cases(
    seed: int, count: int, choices: Sequence[int], one: float = 0.0
) -> Iterator[Case]:
    """``count`` cases from ``random.Random(seed)``: the generator (for the rest of the
    case), a fresh tracer fake mode over its own ShapeEnv, and 1 to 4 sizes drawn from
    ``choices``, one of them set to 1 with probability ``one``."""
    rng = random.Random(seed)
    for _ in range(count):
        mode = TracerFakeMode(shape_env=ShapeEnv())
        sizes = [rng.choice(choices) for _ in range(rng.randint(1, 4))]
        if one and rng.random() < one:
            sizes[rng.randrange(len(sizes))] = 1
        yield rng, mode, sizes


@pytest.fixture
def random_cases() -> RandomCases:
    """``random_cases(seed, count, choices, one=0.0)``: see :func:`_random_cases`."""
    return _random_cases
