"""The reduction tables of the Triton printer: each kind's accumulator start, its per-block
fold and its finish across the block, and Welford's steps (one block: two passes; looped:
per-lane updates joined by Chan's formula, ``triton_prelude._ember_welford``).

>>> COMBINE[Reduce.SUM][0].format(acc="a", v="t0")
'a = a + tl.where(mask, t0, 0)'
>>> identity(Reduce.MAX, torch.int8), identity(Reduce.MIN, torch.float32)
('-128', 'float("inf")')
"""

from __future__ import annotations

import torch

from ember.inductor.ops import Reduce

__all__ = ["COMBINE", "FINISH", "identity", "two_pass", "welford_step"]


def identity(kind: Reduce, dtype: torch.dtype) -> str:
    """The accumulator's start, as a Python literal."""
    floating = dtype.is_floating_point
    if kind in (Reduce.MAX, Reduce.ARGMAX):
        return 'float("-inf")' if floating else str(_limits(dtype)[0])
    if kind in (Reduce.MIN, Reduce.ARGMIN):
        return 'float("inf")' if floating else str(_limits(dtype)[1])
    return {Reduce.PROD: "1", Reduce.ALL: "1"}.get(kind, "0")


def _limits(dtype: torch.dtype) -> tuple[int, int]:
    if dtype == torch.bool:
        return 0, 1
    info = torch.iinfo(dtype)
    return info.min, info.max


# kind -> lines folding value {v} into accumulator {acc} where ``mask`` holds
COMBINE: dict[Reduce, list[str]] = {
    Reduce.SUM: ["{acc} = {acc} + tl.where(mask, {v}, 0)"],
    Reduce.PROD: ["{acc} = {acc} * tl.where(mask, {v}, 1)"],
    Reduce.MAX: ["{acc} = tl.where(mask & ({v} > {acc}), {v}, {acc})"],
    Reduce.MIN: ["{acc} = tl.where(mask & ({v} < {acc}), {v}, {acc})"],
    Reduce.ANY: ["{acc} = {acc} | (mask & ({v} != 0))"],
    Reduce.ALL: ["{acc} = {acc} & ((mask == 0) | ({v} != 0))"],
    # a lane sees its points in order: only a larger value (or a first NaN) takes it
    Reduce.ARGMAX: [
        "{n}_take = mask & (({v} > {acc}) | (({v} != {v}) & ({acc} == {acc})))",
        "{acc} = tl.where({n}_take, {v}, {acc})",
        "{n}_idx = tl.where({n}_take, rindex.to(tl.int64), {n}_idx)",
    ],
    Reduce.ARGMIN: [
        "{n}_take = mask & (({v} < {acc}) | (({v} != {v}) & ({acc} == {acc})))",
        "{acc} = tl.where({n}_take, {v}, {acc})",
        "{n}_idx = tl.where({n}_take, rindex.to(tl.int64), {n}_idx)",
    ],
}

# kind -> the block's result from accumulator {n}_acc (a [XBLOCK] value)
FINISH: dict[Reduce, str] = {
    Reduce.SUM: "tl.sum({n}_acc, 1)",
    Reduce.PROD: "tl.reduce({n}_acc, 1, _ember_mul)",
    Reduce.MAX: "tl.max({n}_acc, 1)",
    Reduce.MIN: "tl.min({n}_acc, 1)",
    Reduce.ANY: "tl.max({n}_acc.to(tl.int32), 1) > 0",
    Reduce.ALL: "tl.min({n}_acc.to(tl.int32), 1) > 0",
    Reduce.ARGMAX: "tl.reduce(({n}_acc, {n}_idx), 1, _ember_argmax)[1]",
    Reduce.ARGMIN: "tl.reduce(({n}_acc, {n}_idx), 1, _ember_argmin)[1]",
}


def two_pass(w: str, v: str, n: int) -> list[str]:
    """Mean and m2 of a row held in one block (no values: 0 and 0, as Welford gives)."""
    return [
        f"{w}_mr = tl.sum(tl.where(mask, {v}, 0.0), 1) / {max(n, 1)}",
        f"{w}_dv = tl.where(mask, {v} - {w}_mr[:, None], 0.0)",
        f"{w}_sr = tl.sum({w}_dv * {w}_dv, 1)",
    ]


def welford_step(w: str, v: str) -> list[str]:
    """One Welford update of each lane by the block's values (masked lanes keep theirs)."""
    return [
        f"{w}_c = {w}_n + tl.where(mask, 1.0, 0.0)",
        f"{w}_d = tl.where(mask, {v} - {w}_mean, 0.0)",
        f"{w}_mean = {w}_mean + {w}_d / tl.where({w}_c == 0, 1.0, {w}_c)",
        f"{w}_m2 = {w}_m2 + tl.where(mask, {w}_d * ({v} - {w}_mean), 0.0)",
        f"{w}_n = {w}_c",
    ]
