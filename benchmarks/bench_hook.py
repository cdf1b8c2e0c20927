"""What ember's frame hook costs per call.

    python benchmarks/bench_hook.py [--quick]

Measured, in one process, on a trivial function ``f(x, y) -> x + y``:

- plain call: ``f`` with no hook installed (the baseline);
- cache hit: the hook installed, ``f``'s cache holding one entry whose
  ``check_fn`` is a trivial Python function returning True, served by a ``fn``
  that does the same work as ``f``: the cost of intercepting, checking and
  replacing a call;
- pass-through: the hook installed for this thread, ``f``'s code marked skip:
  what every call that ember does not handle pays while a compiled region runs;
- pass-through, this callback's skip: the same, with ``f`` skipped only by this
  thread's callback (``Decision.SKIP_FOR_CALLBACK``, as a compiled callable whose
  backend refused ``f`` records it), after three other callbacks skipped it too;
- other thread: the hook installed because another thread has a callback,
  this thread has none.

Also ``fib(20)``, a call-heavy recursion, with and without the hook installed
(the interpreter stops inlining Python-to-Python calls once any PEP 523
function is installed). Prints nanoseconds per call and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

from ember.capture import hook


def f(x, y):
    return x + y


def f_fast(x, y):
    return x + y


def always(x, y):
    return True


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def loop_calls(n: int) -> Callable[[], None]:
    def run() -> None:
        for i in range(n):
            f(i, 1)

    return run


def best_ns_per_call(run: Callable[[], None], calls: int, repeats: int) -> tuple[float, float]:
    """Median and spread (max/min) of ns per call over ``repeats`` timings."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples), max(samples) / min(samples)


def empty_loop_ns(calls: int, repeats: int) -> float:
    def run() -> None:
        for _ in range(calls):
            pass

    return best_ns_per_call(run, calls, repeats)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    args = parser.parse_args()
    calls, repeats = (20_000, 5) if args.quick else (200_000, 15)
    loop = empty_loop_ns(calls, repeats)
    rows: list[tuple[str, float, float]] = []

    def measure(name: str, run: Callable[[], None], n: int = calls) -> float:
        ns, spread = best_ns_per_call(run, n, repeats)
        rows.append((name, ns - (loop if n == calls else 0), spread))
        return rows[-1][1]

    plain = measure("plain call", loop_calls(calls))
    hook.add_entry(f.__code__, hook.CacheEntry(always, f_fast))
    with hook.intercepting(hook.RUN_ONLY):
        hit = measure("cache hit (trivial check_fn)", loop_calls(calls))
    hook.reset()
    hook.skip(f.__code__)
    with hook.intercepting(hook.RUN_ONLY):
        passthrough = measure("pass-through (code skipped)", loop_calls(calls))
    hook.reset()
    others = [  # live callbacks (as compiled callables hold theirs) that skipped f first
        hook.bound_call(lambda frame: hook.Decision.SKIP_FOR_CALLBACK, f) for _ in range(3)
    ]
    for other in others:
        other(1, 2)
    with hook.intercepting(lambda frame: hook.Decision.SKIP_FOR_CALLBACK):
        f(1, 2)
        own_skip = measure("pass-through (this callback's skip)", loop_calls(calls))
    hook.reset()

    stop = threading.Event()
    ready = threading.Event()

    def other_thread() -> None:
        with hook.intercepting(hook.RUN_ONLY):
            ready.set()
            stop.wait()

    t = threading.Thread(target=other_thread)
    t.start()
    ready.wait()
    other = measure("hook installed, no callback here", loop_calls(calls))
    stop.set()
    t.join()

    fib_calls = 21891  # calls made by fib(20)
    fib_plain = measure("fib(20), no hook", lambda: fib(20), fib_calls)
    hook.skip(fib.__code__)
    with hook.intercepting(hook.RUN_ONLY):
        fib_hooked = measure("fib(20), hook installed", lambda: fib(20), fib_calls)
    hook.reset()

    print(f"ember frame hook, per call (loop overhead of {loop:.0f} ns subtracted)")
    print(f"{'case':<36}{'ns/call':>10}{'spread':>9}")
    for name, ns, spread in rows:
        print(f"{name:<36}{ns:>10.0f}{spread:>8.2f}x")
    print()
    print(f"cache hit vs plain call:        {hit:.0f} ns vs {plain:.0f} ns = {hit / plain:.2f}x")
    print(f"cache hit overhead:             {hit - plain:.0f} ns per call")
    print(f"pass-through vs plain call:     {passthrough / plain:.2f}x")
    print(f"callback's own skip vs plain:   {own_skip / plain:.2f}x")
    print(f"other thread's hook, this call: {other / plain:.2f}x")
    print(f"fib(20) with hook installed:    {fib_hooked / fib_plain:.2f}x")


if __name__ == "__main__":
    main()
