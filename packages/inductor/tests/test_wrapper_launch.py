"""A wrapper's per-tensor work in one call (``ember.inductor.wrapper_launch``): the C++
launcher and its Python twins agree, and a graph over many inputs gives eager's results
when an input's storage, strides or values change between calls (nothing is cached)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.aotgraph.hints import mark_input_updates
from ember.inductor import compile_graph, settings, wrapper_bind, wrapper_launch
from ember.inductor.cache import build, load

T = torch.Tensor
NATIVE = wrapper_launch._NATIVE


@pytest.fixture(params=["native", "twin"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Graphs compiled in the test launch their kernels through the C++ launcher, or
    through the Python twins (as where ``ember.inductor._launch`` is not built)."""
    if request.param == "native" and NATIVE is None:
        pytest.skip("ember.inductor._launch is not built here")
    with settings.section.patch(pure_launch=request.param == "twin"):
        yield str(request.param)


class _Sub(torch.Tensor):
    """A subclass: asked through Python (its ``__torch_function__`` sees the call)."""


def _stride_cases() -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    x = torch.randn(4, 6)
    odd = torch.empty_strided((1, 5), (99, 1))  # a size-1 dim with any stride
    return [
        ((x, x.t()), ((6, 1), (1, 6))),
        ((x, x.t()), ((6, 1), (6, 1))),
        ((x.expand(2, 4, 6),), ((0, 6, 1),)),
        ((x.expand(2, 4, 6),), ((24, 6, 1),)),
        ((odd,), ((5, 1),)),
        ((odd,), ((99, 1),)),
        ((torch.zeros(0, 3),), ((3, 1),)),
        ((torch.tensor(1.0),), ((),)),
        ((torch.tensor(1.0),), ((1,),)),
        ((torch.nn.Parameter(x),), ((6, 1),)),
        ((x.as_subclass(_Sub),), ((6, 1),)),
        ((x.as_subclass(_Sub),), ((1, 6),)),
        ((x[:, 1:],), ((6, 1),)),
        ((), ()),
    ]


@pytest.mark.skipif(NATIVE is None, reason="ember.inductor._launch is not built here")
@pytest.mark.parametrize("case", range(len(_stride_cases())))
def test_strides_differ_answers_as_its_twin(case: int) -> None:
    tensors, strides = _stride_cases()[case]
    want = wrapper_launch.py_strides_differ(tensors, strides)
    assert NATIVE is not None and NATIVE.strides_differ(tensors, strides) is want
    assert want is (tuple(t.stride() for t in tensors) != strides)


PROBE = r"""#include <cstdint>
#include <cstring>
extern "C" void probe(double* out, const float* x, double a, int64_t n, bool b) {
  out[0] = x[1]; out[1] = a; out[2] = static_cast<double>(n); out[3] = b ? 1.0 : 0.0;
}
"""


def _probe() -> tuple[Any, Any]:
    """A kernel with every kind of argument: the twin's ctypes function and the packed
    entry point's (address, type codes)."""
    lib = load(build(PROBE + wrapper_launch.PACKED_CPP + "EMBER_PACKED(probe)\n")[0])
    fns = {"probe": lib.probe}
    lib.probe.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_double, ctypes.c_int64, ctypes.c_bool]
    args = {"probe": ["out", "x", "a:float64", "n:int64", "b:bool"]}
    with settings.section.patch(pure_launch=False):  # the C++ launcher's entry, if built
        _, entries = wrapper_launch.kernel_entries(lib, fns, args)
    return fns["probe"], entries["probe"]


@pytest.mark.parametrize("numbers", [(2.5, 7, True), (3, -(2**40), 0), (float("inf"), 0, 2)])
def test_launch_passes_pointers_and_numbers_as_its_twin(numbers: tuple[Any, ...]) -> None:
    fn, entry = _probe()
    x = torch.arange(8.0)[2:]  # a view: its data pointer includes the offset
    want = [3.0, float(numbers[0]), float(numbers[1]), float(bool(numbers[2]))]
    out = torch.zeros(4, dtype=torch.float64)
    wrapper_launch.py_launch(fn, (out, x), *numbers)
    assert out.tolist() == want
    if NATIVE is not None:
        out.zero_()
        NATIVE.launch(entry, (out, x), *numbers)
        assert out.tolist() == want
        out.zero_()
        NATIVE.launch(entry, (out.as_subclass(_Sub), x), *numbers)  # through data_ptr()
        assert out.tolist() == want


@pytest.mark.skipif(NATIVE is None, reason="ember.inductor._launch is not built here")
def test_launch_refuses_what_the_twin_refuses() -> None:
    fn, entry = _probe()
    out, x = torch.zeros(4, dtype=torch.float64), torch.arange(8.0)
    bad: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = [
        ((out, x), (2.5, 1.5, True)),  # a float for an int64
        ((out, x), ("a", 7, True)),  # a str for a double
        ((out, x), (2.5, 7)),  # a number short
        ((out, 3), (2.5, 7, True)),  # not a tensor
    ]
    for tensors, numbers in bad:
        with pytest.raises((TypeError, ctypes.ArgumentError, RuntimeError, AttributeError)):
            wrapper_launch.py_launch(fn, tensors, *numbers)
        with pytest.raises((TypeError, RuntimeError, AttributeError)):
            NATIVE.launch(entry, tensors, *numbers)
    assert out.tolist() == [0.0] * 4  # no call ran


N = 12  # inputs: past the one-line check of a single input


def _update(*ps: T) -> tuple[T, ...]:
    """A functional step over N tensors: a loss and each tensor's new value."""
    loss = sum((p * p).sum() for p in ps)
    return (loss, *(p * 0.5 + k for k, p in enumerate(ps)))


def _step(*ps: T) -> tuple[T, ...]:
    """Each tensor's new value only: every one can be written into its input."""
    return tuple(p * 0.5 + k for k, p in enumerate(ps))


def _compiled(fn: Callable[..., Any], inputs: list[T], updates: dict[int, int]) -> Any:
    gm = make_fx(fn)(*inputs)
    mark_input_updates(gm, updates)
    return compile_graph(gm, inputs, {"graph_cache": False})


def _inputs() -> list[T]:
    torch.manual_seed(0)
    return [torch.randn(8, 4 + k % 3) for k in range(N)]


def test_many_inputs_launch_in_one_call(impl: str) -> None:
    compiled = _compiled(_update, _inputs(), {})
    compiled(*_inputs())  # the wrapper is made on the first call
    assert "_strides_differ((" in compiled.wrapper and "_launch(kernel" in compiled.wrapper
    assert ".data_ptr()" not in compiled.wrapper
    env = compiled._call.__globals__
    if impl == "native":
        assert NATIVE is not None and env["_launch"] is NATIVE.launch
        assert env["_strides_differ"] is NATIVE.strides_differ
        assert isinstance(env["kernel0"], tuple)  # (packed entry's address, number codes)
    else:  # the kernels' ctypes calls, inline (wrapper_launch.inline_launches)
        assert "_launch" not in compiled._call.__code__.co_names
        assert env["_strides_differ"] is wrapper_launch.py_strides_differ


def test_changed_storage_strides_and_values_give_eagers_result(
    impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = _compiled(_update, _inputs(), {})
    xs = _inputs()

    def check() -> None:
        for got, want in zip(compiled(*xs), _update(*xs), strict=True):
            torch.testing.assert_close(got, want)

    check()
    xs[3].set_(torch.randn(8, 4))  # another storage, same tensor object
    check()
    xs[5].data = torch.randn(8, 6)
    check()
    xs[7].mul_(3)  # new values, a new version
    check()
    copies: list[tuple[int, ...]] = []
    real = wrapper_bind._restride

    def counted(t: T, sizes: Any, strides: Any) -> T:
        copies.append(tuple(t.stride()))
        return real(t, sizes, strides)

    monkeypatch.setattr(wrapper_bind, "_restride", counted)
    xs[2] = torch.randn(xs[2].shape[1], 8).t()  # other strides: copied into the layout
    xs[9] = xs[9][:, :]  # a view of the same memory and strides: no copy
    check()
    assert copies == [(1, xs[2].shape[0])]


def test_updates_land_in_the_current_storage(impl: str) -> None:
    updates = {k: k for k in range(N)}  # every new value into its input
    compiled = _compiled(_step, _inputs(), updates)
    xs = _inputs()
    old = xs[4].clone()
    first = xs[0].clone()
    compiled(*xs)
    torch.testing.assert_close(xs[0], first * 0.5)
    fresh = torch.randn(8, 5)
    replaced = xs[4].detach()  # the old storage
    xs[4].set_(fresh.clone())  # the next call must write the new storage, not the old one
    outs = compiled(*xs)
    assert outs[4] is xs[4]
    torch.testing.assert_close(xs[4], fresh * 0.5 + 4)
    torch.testing.assert_close(replaced, old * 0.5 + 4)  # kept the first call's value


@pytest.mark.skipif(
    not os.environ.get("NOX_CURRENT_SESSION"),
    reason="built where a nox session installed ember-inductor (--no-build-isolation)",
)
def test_the_launcher_is_built_in_nox_sessions() -> None:
    assert wrapper_launch.NATIVE, "ember.inductor._launch was not built"


def _with(index: torch.Tensor, values: dict[int, int]) -> torch.Tensor:
    """``index`` with the given values at those positions of its memory order."""
    for position, value in values.items():
        index.view(-1)[position] = value
    return index


OUT_OF_RANGE_CASES = {
    "in range": (torch.tensor([[0, 5, 9]]), 10),
    "too large": (torch.tensor([1, 10, 3]), 10),
    "negative first": (torch.tensor([-1, 12, 3]), 10),
    "int32": (torch.tensor([3, 4, 40], dtype=torch.int32), 10),
    "empty": (torch.zeros(0, dtype=torch.long), 10),
    "strided": (torch.arange(0, 40, 3)[::2], 10),  # not contiguous: asked of the twin
    "uint8": (torch.tensor([1, 200], dtype=torch.uint8), 10),
    "a subclass": (torch.nn.Parameter(torch.tensor([1, 20]), requires_grad=False), 10),
    # the C++ check tests blocks of 4096 whole, then scans the first bad block
    "block edge": (_with(torch.zeros(3, 4096, dtype=torch.long), {4095: 11, 4096: -2}), 10),
    "next block": (_with(torch.zeros(3, 4096, dtype=torch.long), {4096: -2, 9000: 10}), 10),
    "last value": (_with(torch.zeros(10001, dtype=torch.int32), {10000: 10}), 10),
    "size 0": (torch.zeros(5000, dtype=torch.long), 0),
}


@pytest.mark.parametrize("case", list(OUT_OF_RANGE_CASES))
def test_out_of_range_answers_as_its_twin(case: str) -> None:
    index, size = OUT_OF_RANGE_CASES[case]
    want = wrapper_launch.py_out_of_range(index, size)
    assert wrapper_launch.out_of_range(index, size) == want
    if NATIVE is not None:
        got = NATIVE.out_of_range(index, size)
        assert got == want or (got is NotImplemented and case in ("strided", "uint8", "a subclass"))


def test_an_embedding_index_out_of_range_raises_eagers_error() -> None:
    weight = torch.randn(10, 4)

    def f(w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(i, w) * 2

    gm = make_fx(f)(weight, torch.tensor([[1, 2]]))
    call = compile_graph(gm, [weight, torch.tensor([[1, 2]])])
    index = torch.tensor([[3, 9]])
    torch.testing.assert_close(call(weight, index), f(weight, index))
    for bad in (10, -11):  # eager wraps neither
        with pytest.raises(IndexError, match="index out of range in self"):
            f(weight, torch.tensor([[3, bad]]))
        with pytest.raises(IndexError, match="index out of range in self"):
            call(weight, torch.tensor([[3, bad]]))
