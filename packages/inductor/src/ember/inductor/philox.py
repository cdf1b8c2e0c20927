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
code generator puts in every translation unit that draws, :func:`triton_source` the
Triton the Triton printer puts in every module that draws (the same numbers, bit for
bit), and :func:`philox`, :func:`uniform` and :func:`normal` compute the same numbers
over int64 tensors for the reference interpreter and the tests.

Normals take ``log`` and ``cos`` in float64 and round each to float32 once: every
libm disagrees with the next in float32 (numpy's float32 ``log`` differs from glibc's
``logf`` on 3.7 million of the 2**24 possible arguments) but not after that rounding.
Over all 2**24 arguments each function can get, float64 ``log`` lies at least 21
float64 ulps and ``cos`` 127 from a float32 rounding boundary, so glibc, numpy, torch
and CUDA's libdevice (each within 1 ulp) give the same float32. The rest (``sqrt``,
products) is correctly rounded IEEE arithmetic on every target.

>>> philox(torch.tensor([0]), torch.tensor([0]))[0]  # the generator's first output word
tensor([1713891541])
>>> u = uniform(torch.tensor(7), torch.arange(100_000))
>>> bool((u >= 0).all() and (u < 1).all()), round(u.mean().item(), 2)
(True, 0.5)
"""

from __future__ import annotations

import torch

__all__ = ["CPP", "normal", "philox", "rounds", "triton_source", "uniform"]

MASK = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)  # added to the key after each round
ROUNDS = 10
TWO_PI = 6.283185307179586  # the float64 nearest 2 pi, as every target writes it


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
    log = torch.log(u1.double()).float()  # float64, rounded once (the module's docstring)
    cos = torch.cos(TWO_PI * u2.double()).float()
    # torch's float32 sqrt is not correctly rounded (Sleef): float64's, rounded once, is
    return torch.sqrt(-2.0 * log.double()).float() * cos


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
    float l = (float)std::log((double)u1), c = (float)std::cos(6.283185307179586 * (double)u2);
    return std::sqrt(-2.0f * l) * c;
}
"""

# The same generator in Triton: uint32 words (tl.umulhi for the high half of a product,
# wrapping multiplies and adds for the rest); {log}, {cos}: float64 math (libdevice on a GPU,
# whose tl.log and tl.cos may be approximate; numpy's under the interpreter)
TRITON = """

@triton.jit
def _ember_philox(seed, offset):  # Philox4x32-10: counter (offset, 0), key seed
    c0 = offset.to(tl.uint32)
    c1 = (offset >> 32).to(tl.uint32)
    c2 = tl.zeros_like(c0)
    c3 = tl.zeros_like(c0)
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0 = hi1 ^ c1 ^ k0
        c1 = lo1
        c2 = hi0 ^ c3 ^ k1
        c3 = lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1


@triton.jit
def _ember_rand(seed, offset):  # the top 24 bits of the first word, in [0, 1)
    w0, w1 = _ember_philox(seed, offset)
    return (w0 >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _ember_randn(seed, offset):  # Box-Muller (cosine branch) over the first two words
    w0, w1 = _ember_philox(seed, offset)
    u1 = ((w0 >> 8) + 1).to(tl.float32) * 5.9604644775390625e-08
    u2 = (w1 >> 8).to(tl.float32) * 5.9604644775390625e-08
    lg = {log}(u1.to(tl.float64)).to(tl.float32)
    cs = {cos}(6.283185307179586 * u2.to(tl.float64)).to(tl.float32)
    return tl.sqrt_rn(-2.0 * lg) * cs
"""


def triton_source(interpret: bool) -> str:
    """The Triton helpers ``_ember_rand(seed, offset)`` and ``_ember_randn(seed, offset)``
    (blocks of int64 in, float32 out) for a module run under Triton's interpreter or on a GPU.

    >>> "libdevice.log(" in triton_source(False), "tl.log(" in triton_source(True)
    (True, True)
    """
    names = ("tl.log", "tl.cos") if interpret else ("libdevice.log", "libdevice.cos")
    return TRITON.replace("{log}", names[0]).replace("{cos}", names[1])
