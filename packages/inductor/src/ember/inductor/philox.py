"""Counter-based random numbers for generated kernels: Philox4x32-10, twice.

A kernel that draws random numbers cannot share torch's generator (a stream
consumed in order, one thread at a time), so ember's kernels use Philox
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): the
random bits of element ``offset`` are a pure function of ``(seed, offset)``.
Any thread computes any element, in any order, and a value recomputed in
another kernel (a dropout mask read by two consumers) is the same value.
The seed of each random op is drawn from torch's default generator on every
call, so ``torch.manual_seed`` makes a compiled program reproducible (but its
numbers differ from eager's).

This module is the one statement of the generator: :data:`CPP` is the C++ the
code generator puts in every translation unit that draws, and :func:`philox`,
:func:`uniform` and :func:`normal` compute the same numbers over int64 tensors
for the reference interpreter and the tests.

>>> philox(torch.tensor([0]), torch.tensor([0]))[0]  # the generator's first output word
tensor([1713891541])
>>> u = uniform(torch.tensor(7), torch.arange(100_000))
>>> bool((u >= 0).all() and (u < 1).all()), round(u.mean().item(), 2)
(True, 0.5)
"""

from __future__ import annotations

import torch

__all__ = ["CPP", "normal", "philox", "rounds", "uniform"]

MASK = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)  # added to the key after each round
ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` (both below 2**32) without int64 overflow."""
    lo16, hi16 = b & 0xFFFF, b >> 16
    p0, p1 = a * lo16, a * hi16  # each below 2**48
    q = p1 + (p0 >> 16)
    return q >> 16, ((q & 0xFFFF) << 16) | (p0 & 0xFFFF)


def philox(seed: torch.Tensor, offset: torch.Tensor) -> list[torch.Tensor]:
    """The four 32-bit words Philox4x32-10 gives for counter ``(offset, 0)`` and key ``seed``.

    Both arguments are int64 tensors (broadcast together); the words come back as
    int64 tensors holding values in ``[0, 2**32)``.
    """
    zero = torch.zeros_like(offset)
    counter = [offset & MASK, (offset >> 32) & MASK, zero, zero]
    return rounds(counter, [seed & MASK, (seed >> 32) & MASK])


def rounds(counter: list[torch.Tensor], key: list[torch.Tensor]) -> list[torch.Tensor]:
    """The ten rounds over a counter of four words and a key of two (values below 2**32).

    >>> w = rounds([torch.tensor(MASK)] * 4, [torch.tensor(MASK)] * 2)  # Random123's test
    >>> [f"{int(x):08x}" for x in w]
    ['408f276d', '41c83b0e', 'a20bc7c6', '6d5451fd']
    """
    c, (k0, k1) = list(counter), key
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & MASK, (k1 + WEYL[1]) & MASK
        hi0, lo0 = _mulhilo(MULTIPLIERS[0], c[0])
        hi1, lo1 = _mulhilo(MULTIPLIERS[1], c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return c


def uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """float32 in ``[0, 1)`` from the first word's top 24 bits (every float there is exact)."""
    word = philox(seed, offset)[0]
    return (word >> 8).to(torch.float32) * 2.0**-24


def normal(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """float32 standard normal from the first two words (Box-Muller, cosine branch)."""
    words = philox(seed, offset)
    u1 = ((words[0] >> 8) + 1).to(torch.float32) * 2.0**-24  # (0, 1]: the log is finite
    u2 = (words[1] >> 8).to(torch.float32) * 2.0**-24
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)


CPP = r"""
struct EmberPhilox { uint32_t w[4]; };
static inline EmberPhilox ember_philox(int64_t seed, int64_t offset) {
    uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
    }
    return EmberPhilox{{c0, c1, c2, c3}};
}
static inline float ember_rand(int64_t seed, int64_t offset) {
    return (float)(ember_philox(seed, offset).w[0] >> 8) * 0x1p-24f;
}
static inline float ember_randn(int64_t seed, int64_t offset) {
    EmberPhilox x = ember_philox(seed, offset);
    float u1 = (float)((x.w[0] >> 8) + 1) * 0x1p-24f, u2 = (float)(x.w[1] >> 8) * 0x1p-24f;
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}
"""
