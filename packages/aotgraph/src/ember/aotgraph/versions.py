"""Version counters of the inputs a compiled call writes, moved as far as eager's ops did.

Eager's in-place ops move a tensor's version counter once each; the runtime writes an
input once (a copy, or a kernel writing its memory, which moves nothing), so after the
call it sets each written input's counter to its value before the call plus what eager
added (``Signature.versions``). Autograd compares the counters of saved tensors with
their values when saved, so a compiled in-place update fails ``backward()`` where
eager's does.

A compiled optimizer step writes hundreds of inputs (parameters and their state), each
call: the counters are read with one ``map`` over the inputs (``operator.attrgetter``, no
Python frame per tensor) and set in one call, about 35 us for 212 tensors where a
per-tensor loop took about 100. An inference tensor has no counter: a call with one
among them takes the per-tensor path (:func:`set_versions`), which skips it.

>>> import torch
>>> x = torch.zeros(2)
>>> versions = Versions.of(((0, 2),))  # input 0: eager moves its counter by 2
>>> reading = versions.read([x])
>>> _ = x.copy_(torch.ones(2))  # the runtime's one write
>>> reading.advance(); x._version
2
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Reading", "Versions", "set_versions", "version_of"]

_VERSION = operator.attrgetter("_version")
_set = torch._C._autograd._unsafe_set_version_counter  # sets the shared counter, views too


@dataclass(frozen=True, slots=True)
class Versions:
    """Which inputs a call writes (``bumped``: input, how far eager moves its counter).

    >>> Versions.of(((0, 1), (2, 2))).take(["a", "b", "c"]), Versions.of(((1, 1),)).deltas
    (('a', 'c'), (1,))
    """

    bumped: tuple[tuple[int, int], ...]
    take: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]
    deltas: tuple[int, ...]

    @staticmethod
    def of(bumped: tuple[tuple[int, int], ...]) -> Versions:
        """The counters to move for ``bumped`` (pairs of input position and delta)."""
        positions = [i for i, _ in bumped]
        take: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]
        if len(positions) > 1:
            take = operator.itemgetter(*positions)
        else:  # itemgetter of one position returns the item, not a tuple (of none: refused)
            take = lambda inputs: tuple(inputs[i] for i in positions)  # noqa: E731
        return Versions(bumped, take, tuple(d for _, d in bumped))

    def read(self, inputs: Sequence[torch.Tensor]) -> Reading:
        """The counters before the call; :meth:`Reading.advance` after it."""
        if not self.bumped:
            return _NOTHING
        tensors = self.take(inputs)
        try:
            before = list(map(_VERSION, tensors))
        except RuntimeError:  # an inference tensor: no counter to read (nor to set)
            return _PerTensor(inputs, self.bumped)
        return Reading(tensors, before, self.deltas)


class Reading:
    """The counters of a call's written inputs before it ran.

    >>> x = torch.zeros(1)
    >>> reading = Versions.of(((0, 3),)).read([x]); reading.before
    [0]
    >>> reading.advance(); x._version
    3
    """

    __slots__ = ("before", "deltas", "tensors")

    def __init__(
        self, tensors: tuple[torch.Tensor, ...], before: list[int], deltas: tuple[int, ...]
    ) -> None:
        self.tensors, self.before, self.deltas = tensors, before, deltas

    def advance(self) -> None:
        """Set each counter to its value before the call plus eager's delta. All of them,
        in one call: the ones the call already moved that far are set to the same value
        (inputs sharing a counter, views of one tensor, share their delta too)."""
        if self.tensors:
            _set(self.tensors, tuple(map(operator.add, self.before, self.deltas)))


_NOTHING = Reading((), [], ())


class _PerTensor(Reading):
    """:class:`Reading` for calls with an inference tensor among the written inputs."""

    __slots__ = ("bumped", "inputs")

    def __init__(self, inputs: Sequence[torch.Tensor], bumped: Sequence[tuple[int, int]]) -> None:
        super().__init__((), [version_of(inputs[i]) for i, _ in bumped], ())
        self.inputs, self.bumped = inputs, bumped

    def advance(self) -> None:
        set_versions(self.inputs, self.bumped, self.before)


def version_of(t: torch.Tensor) -> int:
    """``t``'s version counter, 0 for an inference tensor (which has none).

    >>> with torch.inference_mode():
    ...     t = torch.zeros(1)
    >>> version_of(t), version_of(torch.zeros(1).add_(1))
    (0, 1)
    """
    return 0 if t.is_inference() else t._version


def set_versions(
    inputs: Sequence[torch.Tensor], bumped: Sequence[tuple[int, int]], start: Sequence[int]
) -> None:
    """Move the version counter of each written input as far as eager's in-place ops did,
    skipping inference tensors (they have none).

    >>> x = torch.zeros(2)
    >>> x.add_(1); _ = x.mul_(2)  # what eager does: two in-place ops
    tensor([1., 1.])
    >>> y = torch.zeros(2)
    >>> _ = y.copy_(x)  # what the runtime does: one copy
    >>> set_versions([y], [(0, 2)], [0]); (x._version, y._version)
    (2, 2)
    """
    tensors, versions = [], []
    for (i, delta), before in zip(bumped, start, strict=True):
        t = inputs[i]
        if not t.is_inference() and t._version != before + delta:
            tensors.append(t)
            versions.append(before + delta)
    if tensors:
        _set(tuple(tensors), tuple(versions))
