"""max_autotune per kernel (Triton): each kernel gets the knobs of the trial that ran it
fastest, and that mix is kept only if the whole graph runs faster under it; the choice is
remembered on disk with the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor import autotune, compile_graph
from ember.inductor.knobs import Knobs

WARPS2, ROWS = Knobs(warps=2), Knobs(row_elements=1024)
KERNEL_TIMES = {
    Knobs(): {"k0": 2.0, "k1": 2.0},
    WARPS2: {"k0": 1.0, "k1": 3.0},
    ROWS: {"k0": 3.0, "k1": 1.0},
}


def _fakes(mixed_seconds: float) -> tuple[Any, Any, autotune.PerKernel]:
    """Sources named after their knobs; the mix of the two winners takes ``mixed_seconds``,
    every other source 1.0 per call."""

    def sources(k: Knobs) -> str:
        return f"warps={k.warps} rows={k.row_elements}"

    def prepare(source: str, inputs: list[Any]) -> Any:
        return lambda: source

    def times(source: str, inputs: list[Any]) -> dict[str, float]:
        return next(t for k, t in KERNEL_TIMES.items() if sources(k) == source)

    def mixed(best: Knobs, per_kernel: dict[str, Knobs]) -> str:
        return "mixed " + ",".join(f"{n}:{sources(k)}" for n, k in sorted(per_kernel.items()))

    timings = {"mixed": mixed_seconds}
    fake = lambda call: timings.get(call().split()[0], 1.0)  # noqa: E731
    return sources, (prepare, fake), autotune.PerKernel(times, mixed)


@pytest.mark.parametrize("mixed_seconds", [0.5, 2.0])
def test_each_kernel_gets_its_fastest_knobs_if_the_mix_is_faster(
    mixed_seconds: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    sources, (prepare, fake), per_kernel = _fakes(mixed_seconds)
    monkeypatch.setattr(autotune, "seconds_per_call", fake)
    x = [torch.randn(4)]
    choice = autotune.choose(sources, x, prepare, list(KERNEL_TIMES), per_kernel)
    want = (("k0", WARPS2), ("k1", ROWS)) if mixed_seconds < 1.0 else ()
    assert choice.per_kernel == want
    again = autotune.choose(sources, x, prepare, list(KERNEL_TIMES), per_kernel)
    assert again.cached and again.per_kernel == want  # from the disk record


def _kernels(source: str) -> dict[str, str]:
    """Each kernel's text (the kernel and its launcher) by name."""
    pieces = source.split("@triton.jit\ndef kernel")[1:]
    return {f"kernel{p.split('(')[0]}": p for p in pieces}


@pytest.mark.interpreted_triton
def test_a_graph_of_two_kernels_gets_knobs_per_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column sum and a row softmax: the first is fastest with two warps, the second with
    smaller row blocks (timers that say so); the module keeps each kernel's winner and
    still gives eager's numbers."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    options = {"cpu_backend": "triton", "graph_cache": False}
    fn = lambda x: (x.sum(0) * 2, torch.softmax(x, -1))  # noqa: E731
    x = torch.randn(64, 100)
    default = _kernels(compile_graph(make_fx(fn)(x), [x], options).source)
    assert list(default) == ["kernel0", "kernel1"]

    def wins(name: str, text: str) -> bool:
        if name == "kernel0":
            return "num_warps=2" in text
        return text != default[name] and "num_warps=2" not in text

    def kernel_seconds(call: Any, spent: Any, cuda: bool) -> dict[str, float]:
        call()  # the real launchers run (under the timers)
        assert set(spent) == {"kernel0", "kernel1"}
        return {n: 1.0 if wins(n, t) else 2.0 for n, t in _kernels(call.func.source).items()}

    def seconds_per_call(call: Any) -> float:
        return 0.5 if all(wins(n, t) for n, t in _kernels(call.func.source).items()) else 1.0

    monkeypatch.setattr(autotune, "kernel_seconds", kernel_seconds)
    monkeypatch.setattr(autotune, "seconds_per_call", seconds_per_call)
    tuned = compile_graph(make_fx(fn)(x), [x], {**options, "max_autotune": True})
    kernels = _kernels(tuned.source)
    assert all(wins(n, t) for n, t in kernels.items()), tuned.source
    torch.testing.assert_close(tuned(x), fn(x))
    (record,) = (tmp_path / "inductor" / "autotune").glob("*.json")
    assert [name for name, _ in json.loads(record.read_text())["per_kernel"]]
