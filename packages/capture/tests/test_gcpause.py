"""A frame compiles with the heap from before it frozen (ember.capture.gcpause, issue 19)."""

from __future__ import annotations

import gc

import torch

from ember.capture import hook, settings
from ember.capture.frame_compiler import FrameCompiler


def f(x):
    return torch.relu(x) * 2 + 1


def _frozen_during_compile() -> tuple[list[int], torch.Tensor]:
    """The freeze count the backend saw while the frame compiled, and the call's result."""
    seen: list[int] = []

    def backend(gm, example):
        seen.append(gc.get_freeze_count())
        return gm.forward

    compiler = FrameCompiler(backend, "eager", entry_codes=(f.__code__,))
    with hook.intercepting(compiler):
        out = f(torch.arange(-2.0, 3.0))
    assert len(compiler.stats.compiled) == 1
    return seen, out


def test_heap_frozen_while_compiling_and_thawed_after():
    assert gc.get_freeze_count() == 0
    old = object()  # exists before the compile: frozen with the rest while it runs
    seen, out = _frozen_during_compile()
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0  # all back in the collected generations
    assert gc.is_tracked([old])
    torch.testing.assert_close(out, torch.relu(torch.arange(-2.0, 3.0)) * 2 + 1)


def test_setting_off_leaves_the_heap_alone():
    with settings.section.patch(freeze_heap=False):
        seen, _ = _frozen_during_compile()
    assert seen == [0]


def test_a_programs_own_freeze_is_left_as_it_is():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        seen, _ = _frozen_during_compile()
        # not frozen again (the count would grow by the objects made since) nor thawed
        # after (it would drop to 0); frozen objects freed meanwhile leave the count
        assert 0 < seen[0] <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_disabled_collector_is_left_alone():
    gc.disable()
    try:
        seen, _ = _frozen_during_compile()
    finally:
        gc.enable()
    assert seen == [0]


def test_garbage_from_before_is_collected_after():
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only a full collection frees it
    del a, b
    _frozen_during_compile()
    assert gc.collect() >= 2  # thawed: found and freed once the compile is over
