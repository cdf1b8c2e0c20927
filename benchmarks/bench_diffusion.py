"""The diffusion models' inference, eager / ember / torch.compile side by side in one process.

    python benchmarks/bench_diffusion.py                      # df-unet-infer, df-vae-infer
    python benchmarks/bench_diffusion.py --workloads df-unet-infer --rounds 9
    python benchmarks/bench_diffusion.py --configs eager,ember,ember+freezing,torch
    python benchmarks/bench_diffusion.py --profile            # per-op tables, too

Each configuration compiles the same model (one copy, built from the seed) and is
checked against eager. The steady state is timed in interleaved rounds: each round
runs every configuration ``--calls`` times and records the thread CPU time per call
(``time.thread_time``: what another process on this shared machine does not
inflate); the table gives the best round (the least disturbed), the median, and the
median over rounds of the first configuration's time over this one's (a ratio taken
within a round, so a slow stretch of the machine slows both sides of it).
Thread CPU time counts only the calling thread, so run with 1 thread (the default,
as the suite's runner does). ``--profile`` prints ``torch.profiler``'s per-op CPU
time for each configuration (where ember's and torch's steps differ). ``steady peak MiB``
is the most tensor memory one steady-state call allocates and has live at once
(``steady_peak_mib``: issue 19's memory column, compile memory excluded), plus the
intermediates ember's compiled graphs keep between calls (``pooled_mib``).

Configurations: ``eager``; ``ember`` (``ember.compiler.compile(backend="inductor")``);
``torch`` (``torch.compile(backend="inductor")``); a ``+freezing`` suffix compiles
with ``options={"freezing": True}`` (ember and torch alike); ``ember+nchw`` keeps
the convolutions on eager's layout (``options={"inductor.conv_channels_last": False}``);
a ``+dynamic`` suffix compiles with ``dynamic=True`` (every size symbolic: issue 18's
steady speed of the dynamic kernels against the static ones, ``--configs ember,ember+dynamic``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from workloads import WORKLOADS

Step = Callable[[], Any]


def _ember(program: Any, extras: set[str]) -> Any:
    import ember.compiler

    options = {"freezing": "freezing" in extras}
    if "nchw" in extras:
        options["inductor.conv_channels_last"] = False
    dynamic = True if "dynamic" in extras else None
    return ember.compiler.compile(program, backend="inductor", options=options, dynamic=dynamic)


def _torch(program: Any, extras: set[str]) -> Any:
    # an options dict makes a backend of its own: dynamo does not serve this program from
    # the entry another configuration compiled for the same code
    options = {"freezing": "freezing" in extras}
    dynamic = True if "dynamic" in extras else None
    return torch.compile(program, backend="inductor", options=options, dynamic=dynamic)


MAKERS: dict[str, Callable[[Any, set[str]], Any]] = {
    "eager": lambda program, extras: program,
    "ember": _ember,
    "torch": _torch,
}


def prepare(workload: str, config: str) -> tuple[Step, float, Any]:
    """``(step, first call s, first output)`` for one configuration of a workload."""
    kind, *extras = config.split("+")
    prepared = WORKLOADS[workload].prepare()
    prepared.compile(lambda program: MAKERS[kind](program, set(extras)))
    step = prepared.step
    start = time.perf_counter()
    out = step()
    return step, time.perf_counter() - start, out


def time_rounds(
    steps: dict[str, Step], rounds: int, calls: int, clock: Callable[[], float] = time.thread_time
) -> dict[str, list[float]]:
    """Ms per call of each step by ``clock`` (the thread's CPU time: another process's turn
    on the cores does not count; wall time where work runs on several threads), one sample
    per round, configurations interleaved."""
    for step in steps.values():  # warm up: allocator, caches, lazy one-time work
        for _ in range(3):
            step()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = clock()
            for _ in range(calls):
                step()
            samples[name].append((clock() - start) * 1e3 / calls)
    return samples


def profile(step: Step, rows: int) -> str:
    """torch.profiler's per-op table (self CPU time) over 10 calls."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def pooled_mib() -> float:
    """MiB of intermediates ember's compiled graphs keep between calls (0 before ember's
    inductor is loaded): resident all the time, so part of the steady-state peak."""
    bind = sys.modules.get("ember.inductor.wrapper_bind")
    return bind.pooled_bytes() / 2**20 if bind is not None else 0.0


def steady_peak_mib(step: Step) -> tuple[float, float]:
    """``(peak, retained)`` MiB of one steady-state call: the most tensor memory allocated
    during the call and live at once, and what of it the call left live at its end. Read from
    ``torch.profiler``'s allocation events (every allocation through c10's CPU allocator:
    aten's, the compiled kernels' buffers, autograd's saved tensors), so compile memory,
    Python objects and the allocator's cached pages do not count, for any configuration.
    The frees of blocks made before the call (a training step's previous gradients, freed
    by ``zero_grad``) do not count either: the profiler reports one only when it happened to
    see the block made, which made the column vary by a model's gradients from run to run."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step()
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    moves: list[tuple[int, int, int]] = []  # (time, address, bytes: negative when freed)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            moves.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(node.children)
    live: dict[int, int] = {}
    now = peak = 0
    for _, ptr, nbytes in sorted(moves):
        if nbytes > 0:
            live[ptr] = nbytes
            now += nbytes
        else:
            now -= live.pop(ptr, 0)  # (a block from before the call: not counted)
        peak = max(peak, now)
    return peak / 2**20, now / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="df-unet-infer,df-vae-infer")
    parser.add_argument("--configs", default="eager,ember,torch")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load: {os.getloadavg()}, threads {args.threads}")
    configs = args.configs.split(",")
    for workload in args.workloads.split(","):
        steps: dict[str, Step] = {}
        firsts: dict[str, float] = {}
        reference = None
        pools: dict[str, float] = {}  # each configuration's resident intermediates
        for config in configs:
            before = pooled_mib()
            steps[config], firsts[config], out = prepare(workload, config)
            pools[config] = pooled_mib() - before
            if reference is None:
                reference = out
            else:
                torch.testing.assert_close(out, reference, rtol=2e-3, atol=2e-3)
        # more than one thread: the work other threads do counts, so wall time (as run.py)
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        samples = time_rounds(steps, args.rounds, args.calls, clock)
        base = samples[configs[0]]
        unit = "thread CPU" if args.threads == 1 else "wall"
        print(f"\n{workload}: {args.rounds} rounds of {args.calls} calls, {unit} ms per call")
        memory = {config: steady_peak_mib(steps[config]) for config in configs}
        print(f"| config | best ms | median ms | x {configs[0]} (best) | x {configs[0]} (median"
              " of rounds) | first call s | steady peak MiB | retained MiB |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for config in configs:
            got = samples[config]
            best, med = min(got), statistics.median(got)
            ratio = statistics.median(b / g for b, g in zip(base, got, strict=True))
            peak, kept = memory[config]
            peak += pools[config]  # allocated before the measured call, live throughout it
            print(f"| {config} | {best:.2f} | {med:.2f} | {min(base) / best:.3f} | {ratio:.3f} "
                  f"| {firsts[config]:.1f} | {peak:.2f} | {kept:.2f} |")  # fmt: skip
        if args.profile:
            for config in configs:
                print(f"\n### {workload} {config}\n{profile(steps[config], args.rows)}")
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
