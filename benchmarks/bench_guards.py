"""Guard-check benchmark: ember.guards on a realistic frame vs torch.compile's per-call overhead.

The frame: ``Net.forward(self, a, b, c, d, k0, k1, k2, k3, flag, mode)`` where
``self`` holds 12 parameters (6 ``Linear`` layers in a ``ModuleList``), ``a..d``
are tensors and 10 Python constants are read (6 arguments, 4 attributes of a
global config). The guard set is what a capture would install: global state,
backend, module identities and states, constants, no aliasing between the 16
tensor inputs, and a tensor match for each of them.

Run: ``python3 benchmarks/bench_guards.py [--quick]``. Torch runs with
``torch.set_num_threads(1)`` so both measurements see the same single thread.

``--shapes`` times instead a frame with dynamic shapes against the same frame static:
``attend(q, kv, n)`` with ``q`` of size ``(B, 64)``, ``kv`` of size ``(2*B, 64)``
and an int ``n``; static, the two tensor matches pin B; dynamic, they leave B free and
four relations check ``B >= 2``, ``kv.size(0) == 2*B``, ``B*64 <= 1<<20`` and ``n % 8 == 0``
(target: at most 1.5x the static check).
"""

from __future__ import annotations

import argparse
import gc
import time
import types
from collections.abc import Callable

import torch

import ember.guards as eg
from ember.guards import Attr, Global, Local, ModuleChild

CONFIG = types.SimpleNamespace(eps=1e-5, scale=0.5, act="relu", depth=6)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(6))

    def forward(self, a, b, c, d, k0, k1, k2, k3, flag, mode):  # type: ignore[no-untyped-def]
        x = a + b * c - d
        for layer in self.layers[: CONFIG.depth]:
            x = layer(x) * CONFIG.scale + k0
        if flag and mode == "train":
            x = x + CONFIG.eps * (k1 + k2 + k3)
        return torch.relu(x) if CONFIG.act == "relu" else x


def frame_guards(net: Net, args: tuple[object, ...]) -> eg.GuardSet:
    """The guards a capture of ``net.forward(*args)`` would install."""
    names = ("a", "b", "c", "d", "k0", "k1", "k2", "k3", "flag", "mode")
    layers = ModuleChild(Local("self"), "layers")
    guards = [eg.backend("eager"), *eg.global_state(), eg.id_match(Local("self"), net)]
    guards += [eg.id_match(layers, net.layers), eg.module_state(Local("self"), net)]
    guards += [eg.id_match(Global("CONFIG"), CONFIG)]
    guards += [eg.equals(Attr(Global("CONFIG"), k), getattr(CONFIG, k)) for k in vars(CONFIG)]
    tensors = []
    for name, value in zip(names, args, strict=True):
        if isinstance(value, torch.Tensor):
            tensors.append(eg.tensor_match(Local(name), value))
        else:
            guards.append(eg.equals(Local(name), value))
    for i, layer in enumerate(net.layers):
        source = ModuleChild(layers, str(i))
        guards += [eg.id_match(source, layer), eg.module_state(source, layer)]
        for pname, param in layer.named_parameters():
            tensors.append(eg.tensor_match(ModuleChild(source, pname, eg.PARAMETERS), param))
    guards.append(eg.no_aliasing(*(g.source for g in tensors)))
    return eg.GuardSet(guards + tensors)


def per_call_ns(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """Best-of-``repeats`` mean time of one ``fn()`` call, in ns."""
    best = float("inf")
    for _ in range(repeats):
        gc.disable()
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / calls)
        gc.enable()
    return best


def torch_overhead_ns(net: Net, args: tuple[object, ...], calls: int, repeats: int) -> float:
    """Per-call cost of ``torch.compile(Net.forward, backend="eager")`` beyond its graph.

    The graph's forward is timed on the real inputs that a recording twin of the
    "eager" backend (which returns ``gm.forward``) captured. A plain call is no
    baseline here: the graph also skips the nn.Module call machinery.
    """
    recorded: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        def run(*inputs: object) -> object:
            if not recorded:
                recorded.append((gm.forward, inputs))
            return gm.forward(*inputs)

        return run

    compiled = torch.compile(Net.forward, backend="eager")
    torch.compile(Net.forward, backend=recording)(net, *args)
    ((graph_fn, inputs),) = recorded
    for _ in range(3):
        compiled(net, *args)  # compile, then warm
    graph, comp = float("inf"), float("inf")
    for _ in range(repeats):  # interleaved, so drift hits both alike
        graph = min(graph, per_call_ns(lambda: graph_fn(*inputs), calls, 1))
        comp = min(comp, per_call_ns(lambda: compiled(net, *args), calls, 1))
    return comp - graph


def attend(q, kv, n):  # type: ignore[no-untyped-def]
    return (q @ kv.t()).softmax(-1)[:, :n]


def shape_guards(q: torch.Tensor, kv: torch.Tensor, n: int, dynamic: bool) -> eg.GuardSet:
    """``attend``'s guards: static (sizes and n pinned) or dynamic (batch dims free)."""
    state = [eg.backend("eager"), *eg.global_state()]
    alias = eg.storage_aliasing([Local("q"), Local("kv")], [q, kv])
    if not dynamic:
        tensors = [eg.tensor_match(Local("q"), q), eg.tensor_match(Local("kv"), kv)]
        return eg.GuardSet([*state, alias, *tensors, eg.equals(Local("n"), n)])
    b, b2 = eg.TensorSize(Local("q"), 0), eg.TensorSize(Local("kv"), 0)
    tensors = [
        eg.tensor_match(Local("q"), q, dynamic_sizes={0}),
        eg.tensor_match(Local("kv"), kv, dynamic_sizes={0}),
    ]
    relations = [
        eg.shape_relation("s0 >= 2", {"s0": b}),
        eg.shape_relation("s1 == 2*s0", {"s0": b, "s1": b2}),
        eg.shape_relation("s0*64 <= 1048576", {"s0": b}),
        eg.shape_relation("(n % 8) == 0", {"n": Local("n")}),
    ]
    return eg.GuardSet([*state, eg.type_match(Local("n"), n), alias, *tensors, *relations])


def shapes_main(quick: bool) -> None:
    """Time ``attend``'s dynamic check against its static one, interleaved."""
    args = (torch.randn(8, 64), torch.randn(16, 64), 16)
    frame = eg.FrameSpec.from_function(attend)
    static = shape_guards(*args, dynamic=False).compile(frame)
    dynamic = shape_guards(*args, dynamic=True).compile(frame)
    other = (torch.randn(5, 64), torch.randn(10, 64), 24)
    checks, repeats = (10_000, 3) if quick else (200_000, 7)
    with eg.backend_scope("eager"):
        assert static.check(*args) and dynamic.check(*args) and dynamic.check(*other)
        assert not static.check(*other)
        print(f"a failing call explains itself: {dynamic.explain_failure(other[0], *args[1:])}")
        static_ns = dynamic_ns = float("inf")
        for _ in range(repeats):
            static_ns = min(static_ns, per_call_ns(lambda: static.check(*args), checks, 1))
            dynamic_ns = min(dynamic_ns, per_call_ns(lambda: dynamic.check(*args), checks, 1))
    print(f"C++ tensor matcher: {eg.TENSOR_MATCH_CXX}; C accelerator: {eg.NATIVE}")
    print(f"static check  ({len(static.guards)} guards): {static_ns:,.0f} ns/check")
    print(f"dynamic check ({len(dynamic.guards)} guards, 4 relations): {dynamic_ns:,.0f} ns/check")
    ratio = dynamic_ns / static_ns
    verdict = "met" if ratio <= 1.5 else "missed"
    print(f"ratio dynamic / static: {ratio:.2f} (target <= 1.5: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--shapes", action="store_true", help="dynamic vs static shape check")
    options = parser.parse_args()
    quick = options.quick
    if options.shapes:
        shapes_main(quick)
        return
    torch.set_num_threads(1)
    net = Net()
    args = (*(torch.randn(2, 4) for _ in range(4)), 1, 2.0, 3, 4, True, "train")
    guards = frame_guards(net, args)
    frame = eg.FrameSpec.from_function(Net.forward)  # type: ignore[arg-type]
    compiled = guards.compile(frame)
    no_tensors = eg.GuardSet(g for g in guards if g.kind is not eg.GuardKind.TENSOR_MATCH)
    frame_args = (net, *args)
    checks, repeats = (10_000, 3) if quick else (100_000, 7)
    with eg.backend_scope("eager"):
        assert compiled.check(*frame_args), compiled.explain_failure(*frame_args)
        check_ns = per_call_ns(lambda: compiled.check(*frame_args), checks, repeats)
        rest = no_tensors.compile(frame).check
        rest_ns = per_call_ns(lambda: rest(*frame_args), checks, repeats)
        bad = (net, torch.randn(3, 4), *args[1:])
        print(f"a failing call explains itself: {compiled.explain_failure(*bad)}")
    tensors = len(guards) - len(no_tensors)
    print(f"torch.set_num_threads(1); C accelerator: {eg.NATIVE}; guards: {len(guards)}")
    print(f"ember.guards check: {check_ns:,.0f} ns/check over {checks:,} checks")
    print(f"  of which {tensors} tensor matches: {check_ns - rest_ns:,.0f} ns")
    overhead = torch_overhead_ns(net, args, 200 if quick else 1_000, 5 if quick else 15)
    print(f"torch.compile(fn, backend='eager') per-call overhead: {overhead:,.0f} ns")
    ratio = check_ns / overhead
    verdict = "met" if ratio <= 0.1 else "missed"
    print(f"ratio check / torch overhead: {ratio:.2f} (target <= 0.10: {verdict})")


if __name__ == "__main__":
    main()
