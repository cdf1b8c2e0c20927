"""ember.aotgraph: bytes saved for backward by each partitioner, and training step time.

    python benchmarks/bench_aot.py [--quick]

Workloads run at their full sizes (``--quick`` only takes fewer steps: the
quick GPT workload draws labels past its quick vocabulary).

1. Saved for backward: the GPT-style decoder and the ResNet-style CNN of
   ``benchmarks/workloads.py`` (plus the MLP), captured by ember, traced by
   ``aot_compile`` and partitioned by ``default`` and by ``min_cut``, with
   ember's default decomposition table and with none (what ``aot_eager`` uses).
   ``saved`` counts every tensor the forward graph hands to the backward graph;
   ``activations`` leaves out graph inputs (parameters and the batch) and views
   of them, which are alive anyway. Rows ``torch:default`` and ``torch:min_cut``
   run torch's own partitioners on the same captured graph, for reference.
2. Training step time (forward, loss, backward, optimizer step; one thread,
   median over rounds in which the configurations take turns): eager, ember's ``aot_eager``
   backend, and ``torch.compile(backend="aot_eager")``, the peer.

Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from workloads import WORKLOADS

import ember.compiler
from ember.aotgraph import aot_compile, default_decompositions
from ember.aotgraph.ops import OpClass, node_class, tensor_bytes

SAVED_WORKLOADS = ["gpt-train", "resnet-train", "mlp-train"]
STEP_WORKLOADS = ["mlp-train", "resnet-train", "gpt-train", "rnn-train", "graph-breaks-train"]


def _as_is(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm


def _view_of_input(node: torch.fx.Node) -> bool:
    while node_class(node) is OpClass.VIEW and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node.op == "placeholder"


def torch_saved(
    gm: torch.fx.GraphModule, example_inputs: list[Any], partition: str, table: dict[Any, Any]
) -> tuple[int, int, int]:
    """(tensors, bytes, bytes not of primals) torch's own partitioner saves, for reference."""
    from torch._functorch import partitioners
    from torch._functorch.aot_autograd import aot_module_simplified

    torch_fn = {"default": partitioners.default_partition,
                "min_cut": partitioners.min_cut_rematerialization_partition}[partition]  # fmt: skip
    found: list[tuple[int, int, int]] = []

    def record(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        fw, bw = torch_fn(joint, joint_inputs, **kwargs)
        nodes = {n.name: n for n in joint.graph.nodes}
        saved = [n for n in bw.graph.find_nodes(op="placeholder") if "tangents" not in n.name]
        sizes = [(n.name, tensor_bytes(n.meta.get("val"))) for n in saved]
        activations = sum(b for name, b in sizes if not _view_of_input(nodes[name]))
        found.append((len(saved), sum(b for _, b in sizes), activations))
        return fw, bw

    aot_module_simplified(gm, example_inputs, fw_compiler=_as_is, partition_fn=record,
                          decompositions=table)  # fmt: skip
    return found[0]


def saved_bytes(name: str) -> list[tuple[str, str, int, int, int]]:
    """(table, partition, tensors, bytes, activation bytes) for each graph of one workload;
    partition names starting with ``torch:`` are torch's partitioners on the same graph."""
    rows: list[tuple[str, str, int, int, int]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        tables = {"default": default_decompositions(), "none": {}}
        for table_name, table in tables.items():
            for partition in ("default", "min_cut"):
                compiled = aot_compile(
                    gm, example_inputs, fw_compiler=_as_is, partition=partition,
                    decompositions=table,
                )  # fmt: skip
                part = compiled.partition
                assert part is not None
                n = len(part.saved)
                rows.append((table_name, partition, n, part.saved_bytes, part.activation_bytes))
                peer = torch_saved(gm, example_inputs, partition, table)
                rows.append((table_name, f"torch:{partition}", *peer))
        return gm.forward

    run = WORKLOADS[name].prepare()
    ember.compiler.reset()
    run.compile(lambda program: ember.compiler.compile(program, backend=backend))
    run.step()
    return rows


def _torch_aot_eager(program: Any) -> Any:
    return torch.compile(program, backend="aot_eager")


CONFIGS: dict[str, Callable[[Any], Any] | None] = {
    "eager": None,
    "ember:aot_eager": lambda p: ember.compiler.compile(p, backend="aot_eager"),
    "torch:aot_eager": _torch_aot_eager,
}


def step_times(name: str, quick: bool) -> dict[str, tuple[float, float]]:
    """Config -> (first step seconds, including compilation; median ms per step).

    The configurations take turns, one block of steps each per round, so that
    load from other processes on the machine falls on all of them alike.
    """
    warmup, steps, rounds = (2, 3, 3) if quick else (3, 5, 15)
    runs, first = {}, {}
    for config, make in CONFIGS.items():
        run = WORKLOADS[name].prepare()
        if make is not None:
            run.compile(make)
        start = time.perf_counter()
        run.step()
        first[config] = time.perf_counter() - start
        for _ in range(warmup):
            run.step()
        runs[config] = run
    samples: dict[str, list[float]] = {config: [] for config in CONFIGS}
    for _ in range(rounds):
        for config, run in runs.items():
            start = time.perf_counter()
            for _ in range(steps):
                run.step()
            samples[config].append((time.perf_counter() - start) / steps * 1e3)
    return {c: (first[c], statistics.median(samples[c])) for c in CONFIGS}


def main() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)  # the peer's graph-break notes
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # An empty cache folder: a first step then includes tracing (ember.aotgraph keeps traced
    # graphs on disk, so a second run would otherwise time its cache hits).
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-bench-aot-")
    print(f"torch {torch.__version__}, 1 thread, {'few' if args.quick else 'more'} steps\n")
    print("Saved for backward (per captured graph)")
    print(
        f"{'workload':<20}{'decomps':<9}{'partition':<16}{'tensors':>8}{'saved':>12}{'activations':>13}"
    )
    for name in SAVED_WORKLOADS:
        for table, partition, n, total, activations in saved_bytes(name):
            print(f"{name:<20}{table:<9}{partition:<16}{n:>8}{total:>12,}{activations:>13,}")
    print("\nTraining step (forward, loss, backward, optimizer step)")
    header = "".join(f"{c:>18}" for c in CONFIGS)
    print(f"{'workload':<20}{header}   (ms per step; first step incl. compile in s)")
    for name in STEP_WORKLOADS:
        times = step_times(name, args.quick)
        cells = "".join(f"{f'{ms:.2f} ({first:.1f}s)':>18}" for first, ms in times.values())
        print(f"{name:<20}{cells}")


if __name__ == "__main__":
    main()
