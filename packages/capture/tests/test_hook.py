"""The frame hook against plain Python: what is intercepted, what is served, what is freed."""

from __future__ import annotations

import gc
import sys
import threading
import traceback
import tracemalloc
import types
import weakref
from collections.abc import Callable

import pytest

from ember.capture import hook
from ember.capture.hook import CacheEntry, Decision


@pytest.fixture(autouse=True)
def clean_hook():
    hook.reset()
    assert hook.get_callback() is None
    yield
    hook.reset()
    assert hook.get_callback() is None, "a test left a callback set"
    assert hook.state().active_threads == 0


class Recorder:
    """A callback that records the names it sees and answers from a table."""

    def __init__(self, answers: dict[types.CodeType, CacheEntry] | None = None):
        self.answers = answers or {}
        self.seen: list[str] = []

    def __call__(self, frame: hook.Frame) -> CacheEntry | Decision:
        if frame.code.co_filename != __file__:
            return Decision.SKIP  # pytest's, threading's: not what these tests look at
        self.seen.append(frame.code.co_name)
        return self.answers.get(frame.code, Decision.RUN)


def always(*args: object) -> bool:
    return True


# -- argument forms ---------------------------------------------------------------------------


def kw_everything(a, b=2, *rest, c, d=4, **kw):
    return ("eager", a, b, rest, c, d, kw)


def kw_everything_fast(a, b, c, d, rest, kw):  # co_varnames order of kw_everything
    return ("fast", a, b, rest, c, d, kw)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {"c": 3}),
        ((1, 5, 6, 7), {"c": 3, "z": 9}),
        ((1,), {"c": 3, "d": 8, "b": 0}),
    ],
)
def test_every_argument_slot_reaches_check_and_fn(args, kwargs):
    seen_by_check = []

    def check(*slots):
        seen_by_check.append(slots)
        return True

    cb = Recorder({kw_everything.__code__: CacheEntry(check, kw_everything_fast)})
    with hook.intercepting(cb):
        first = kw_everything(*args, **kwargs)  # miss: the new entry serves it unchecked
        got = kw_everything(*args, **kwargs)  # hit: checked
    eager = kw_everything(*args, **kwargs)
    assert first == got
    assert got == ("fast", *eager[1:])
    assert hook.argument_names(kw_everything.__code__) == ("a", "b", "c", "d", "rest", "kw")
    assert seen_by_check == [(eager[1], eager[2], eager[4], eager[5], eager[3], eager[6])]


def test_closures_and_cells_reach_fn_through_its_closure():
    def outer(scale):
        offset = 1  # a cell: inner reads it

        def inner(x):
            return x * scale + offset

        def inner_fast(x):
            return ("fast", x * scale + offset)

        return inner, inner_fast

    inner, inner_fast = outer(10)
    fn = hook.function_like(inner_fast.__code__, inner)
    with hook.intercepting(Recorder({inner.__code__: CacheEntry(always, fn)})):
        assert inner(2) == ("fast", 21)


def test_cell_argument_is_passed_as_its_value():
    def cellarg(a):
        def g():
            return a

        return g() + 1

    def cellarg_fast(a):
        return ("fast", a)

    with hook.intercepting(Recorder({cellarg.__code__: CacheEntry(always, cellarg_fast)})):
        assert cellarg(20) == ("fast", 20)
    assert cellarg(20) == 21


def test_entry_serves_only_frames_with_its_own_closure_cells():
    def make(k):
        def f(x):
            return x + k

        return f

    f1, f2 = make(1), make(100)
    assert f1.__code__ is f2.__code__

    misses = []

    def on_miss(frame):
        misses.append(frame.function)
        return CacheEntry(always, hook.function_like(f1.__code__, frame.function))

    with hook.intercepting(on_miss):
        assert (f1(1), f2(1), f1(2), f2(2)) == (2, 101, 3, 102)
    # one entry per closure; each later call was a hit on its own entry
    assert misses == [f1, f2]
    assert len(hook.entries(f1.__code__)) == 2


def test_entry_serves_only_frames_with_its_own_globals():
    src = "def f(x):\n    return x + K\n"
    g1: dict[str, object] = {"K": 1}
    g2: dict[str, object] = {"K": 2}
    exec(compile(src, "<g>", "exec"), g1)
    f1 = g1["f"]
    f2 = types.FunctionType(f1.__code__, g2)  # same code, other globals
    misses = []

    def on_miss(frame):
        misses.append(frame.globals["K"])
        return CacheEntry(always, hook.function_like(frame.code, frame.function))

    with hook.intercepting(on_miss):
        assert (f1(0), f2(0), f1(0), f2(0)) == (1, 2, 1, 2)
    assert misses == [1, 2]


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, by=1):
        self.n += by
        return self.n


def test_methods_pass_self_as_first_slot():
    got = []

    def check(self, by):
        got.append((type(self).__name__, by))
        return True

    def bump_fast(self, by):
        return ("fast", by)

    c = Counter()
    with hook.intercepting(Recorder({Counter.bump.__code__: CacheEntry(check, bump_fast)})):
        assert c.bump(4) == ("fast", 4)  # miss: the new entry serves it unchecked
        assert c.bump(5) == ("fast", 5)
    assert got == [("Counter", 5)]
    assert c.n == 0


def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)


def fact_fast(n):  # what a translation would do: calls the original function for n - 1
    return 1 if n <= 1 else n * fact(n - 1)


def test_recursion_intercepts_every_level():
    calls = []

    def check(n):
        calls.append(n)
        return True

    with hook.intercepting(Recorder({fact.__code__: CacheEntry(check, fact_fast)})):
        assert fact(30) == 265252859812191058636308480000000  # levels 29..1 are hits
        assert fact(30) == 265252859812191058636308480000000  # every level a hit
    assert calls == list(range(29, 0, -1)) + list(range(30, 0, -1))


def test_deep_recursion_does_not_crash():
    def down(n):
        return 0 if n == 0 else 1 + down(n - 1)

    with hook.intercepting(Recorder()):
        assert down(400) == 400
        with pytest.raises(RecursionError):
            down(sys.getrecursionlimit() + 100)


# -- exceptions -------------------------------------------------------------------------------


def raising_fast(x):
    raise ValueError(f"bad value {x}")  # LINE: raising_fast


def plain(x):
    return x


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def test_exception_inside_fn_propagates_with_the_users_line():
    with hook.intercepting(Recorder({plain.__code__: CacheEntry(always, raising_fast)})):
        with pytest.raises(ValueError, match="bad value 7") as info:
            plain(7)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (__file__, _line_of("# LINE: raising_fast"))


def test_exception_inside_callback_propagates_and_leaves_the_hook_usable():
    def bad_callback(frame):
        if frame.code is plain.__code__:
            raise KeyError("compiler bug")  # LINE: bad_callback
        return Decision.SKIP

    with hook.intercepting(bad_callback):
        with pytest.raises(KeyError) as info:
            plain(1)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (__file__, _line_of("# LINE: bad_callback"))
    cb = Recorder()
    with hook.intercepting(cb):
        assert plain(2) == 2
    assert cb.seen == ["plain"]


def test_exception_inside_check_propagates():
    def check(x):
        raise RuntimeError("guard bug")

    with hook.intercepting(Recorder({plain.__code__: CacheEntry(check, plain)})):
        assert plain(1) == 1  # miss: the entry is created and serves this call
        with pytest.raises(RuntimeError, match="guard bug"):
            plain(1)


@pytest.mark.parametrize(
    "answer", [42, (1, 2, 3), (always, "not callable"), CacheEntry(1, 2), "run"]
)
def test_callback_returning_garbage_raises_type_error(answer):
    def on_miss(frame):
        return answer if frame.code is plain.__code__ else Decision.SKIP

    with hook.intercepting(on_miss):
        with pytest.raises(TypeError, match=r"ember frame callback|callable"):
            plain(1)


def test_set_callback_rejects_bad_values():
    with pytest.raises(TypeError):
        hook.set_callback(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hook.entries("not code")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hook.add_entry(plain.__code__, (1, 2))  # type: ignore[arg-type]
    assert hook.get_callback() is None


# -- frames that are never intercepted --------------------------------------------------------


def test_generator_frames_are_untouched():
    def gen(n):
        for i in range(n):
            received = yield i
            if received:
                yield received

    cb = Recorder()
    outside = gen(3)
    next(outside)
    with hook.intercepting(cb):
        assert list(gen(3)) == [0, 1, 2]
        assert outside.send("x") == "x"
        with pytest.raises(ValueError):
            outside.throw(ValueError("in generator"))
        g = (i * 2 for i in range(3))
        assert list(g) == [0, 2, 4]
    assert "gen" not in cb.seen and "<genexpr>" not in cb.seen


def test_coroutines_and_class_bodies_are_untouched():
    async def coro():
        return 5

    cb = Recorder()
    with hook.intercepting(cb):
        c = coro()
        with pytest.raises(StopIteration) as stop:
            c.send(None)

        class Body:
            x = 1

    assert stop.value.value == 5 and Body.x == 1
    assert cb.seen == []


def test_an_entrys_fn_is_not_intercepted_but_what_it_calls_is():
    def helper(x):
        return x + 1

    def outer(x):
        return helper(x)

    def outer_fast(x):
        return helper(x) * 10

    cb = Recorder({outer.__code__: CacheEntry(always, outer_fast)})
    with hook.intercepting(cb):
        assert outer(1) == 20
    assert cb.seen == ["outer", "helper"]


def test_skip_decision_is_remembered_until_reset():
    calls = []

    def on_miss(frame):
        calls.append(frame.code.co_name)
        return Decision.SKIP

    with hook.intercepting(on_miss):
        plain(1)
        plain(2)
    assert calls == ["plain"] and hook.is_skipped(plain.__code__)
    hook.reset()
    assert not hook.is_skipped(plain.__code__)


def test_a_skip_for_one_callback_leaves_the_others_asking():
    calls: list[str] = []

    def mine(frame):
        calls.append("mine")
        return Decision.SKIP_FOR_CALLBACK

    def theirs(frame):
        calls.append("theirs")
        return Decision.RUN

    with hook.intercepting(mine):
        plain(1)
        plain(2)
        assert hook.is_skipped(plain.__code__, mine)
        with hook.intercepting(theirs):
            plain(3)
            plain(4)
        plain(5)
    assert calls == ["mine", "theirs", "theirs"]
    assert not hook.is_skipped(plain.__code__) and not hook.is_skipped(plain.__code__, theirs)


def test_a_callback_skip_is_kept_while_a_bound_call_holds_it_and_reset_forgets_it():
    calls: list[int] = []

    def mine(frame):
        calls.append(1)
        return Decision.SKIP_FOR_CALLBACK

    bound = hook.bound_call(mine, plain)
    bound(1)
    with hook.intercepting(mine):  # the same callback: the same skips
        plain(2)
    bound(3)
    assert len(calls) == 1 and hook.is_skipped(plain.__code__, mine)
    hook.reset()
    assert not hook.is_skipped(plain.__code__, mine)
    bound(4)
    assert len(calls) == 2
    del bound
    gc.collect()
    assert not hook.is_skipped(plain.__code__, mine)  # its record went with it
    with hook.intercepting(mine):
        plain(5)
    assert len(calls) == 3


# -- modes, nesting, threads ------------------------------------------------------------------


def test_run_only_serves_hits_and_never_compiles():
    def fast(x):
        return ("fast", x)

    hook.add_entry(plain.__code__, CacheEntry(lambda x: x > 0, fast))
    with hook.intercepting(hook.RUN_ONLY):
        assert plain(1) == ("fast", 1)
        assert plain(-1) == -1  # miss: runs normally, nothing compiled
    assert len(hook.entries(plain.__code__)) == 1


def test_nested_set_and_unset_restore_the_previous_callback():
    outer_cb, inner_cb = Recorder(), Recorder()
    with hook.intercepting(outer_cb):
        plain(1)
        with hook.intercepting(inner_cb):
            assert hook.get_callback() is inner_cb
            Counter().bump()
            with hook.intercepting(hook.RUN_ONLY):
                fact(3)
        assert hook.get_callback() is outer_cb
        fact(2)
        assert hook.state().installed == "top"
    assert outer_cb.seen == ["plain", "fact", "fact"]
    assert inner_cb.seen == ["__init__", "bump"]
    assert hook.state() == hook.HookState("absent", 0, hook.state().live_caches)


def test_callback_is_restored_when_the_body_raises():
    with pytest.raises(ZeroDivisionError):
        with hook.intercepting(Recorder()):
            1 / 0  # noqa: B018
    assert hook.get_callback() is None
    assert hook.state().installed == "absent"


def _run_in_thread(target: Callable[[], object]) -> None:
    errors: list[BaseException] = []

    def wrapped():
        try:
            target()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=wrapped)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def test_a_callback_on_one_thread_does_not_affect_another():
    main_cb, worker_cb = Recorder(), Recorder()
    ready, go = threading.Event(), threading.Event()

    def without_callback():
        ready.set()
        go.wait(5)
        assert hook.get_callback() is None
        plain(1)
        Counter().bump()

    def with_callback():
        with hook.intercepting(worker_cb):
            fact(2)

    t = threading.Thread(target=without_callback)
    t.start()
    ready.wait(5)
    with hook.intercepting(main_cb):
        go.set()  # the other thread runs while this one has a callback
        t.join()
        _run_in_thread(with_callback)
        plain(3)
        assert hook.state().active_threads == 1
    assert main_cb.seen == ["_run_in_thread", "plain"]
    assert worker_cb.seen == ["fact", "fact"]


def test_two_threads_with_callbacks_at_once():
    barrier = threading.Barrier(2)
    seen: dict[str, list[str]] = {}

    def worker(name):
        cb = Recorder()
        with hook.intercepting(cb):
            barrier.wait(5)
            for _ in range(50):
                plain(name)
            barrier.wait(5)
            assert hook.state().active_threads == 2
            barrier.wait(5)
        seen[name] = cb.seen

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each thread asked its own callback once per call (RUN caches nothing)
    assert seen == {"a": ["plain"] * 50, "b": ["plain"] * 50}
    assert hook.state().installed == "absent"


def test_the_hook_steps_out_while_its_callback_runs():
    """A callback (a compile) runs with the eval function out of the chain: installed, it
    passes the callback's frames through but costs each of its Python calls about 1.4x
    (3.11 stops inlining Python-to-Python calls). It is back for the entry it returns."""
    during: list[str] = []
    entry = CacheEntry(always, lambda x: ("fast", x))

    def callback(frame: hook.Frame) -> CacheEntry | Decision:
        if frame.code is not plain.__code__:
            return Decision.SKIP
        during.append(hook.state().installed)
        assert plain(2) == 2  # not intercepted: the callback's own calls pass through
        return entry

    with hook.intercepting(callback):
        assert plain(1) == ("fast", 1)
        assert hook.state().installed == "top"
        assert plain(3) == ("fast", 3)  # served: the hook is back
    assert during == ["absent"]


def test_the_hook_stays_while_another_thread_has_a_callback():
    during: list[str] = []
    holding, done = threading.Event(), threading.Event()

    def other():
        with hook.intercepting(Recorder()):
            holding.set()
            done.wait(5)

    def callback(frame: hook.Frame) -> Decision:
        if frame.code is plain.__code__:
            during.append(hook.state().installed)
        return Decision.SKIP

    t = threading.Thread(target=other)
    t.start()
    holding.wait(5)
    try:
        with hook.intercepting(callback):
            plain(1)
    finally:
        done.set()
        t.join()
    assert during == ["top"]  # the other thread's frames still need it


def test_a_thread_that_dies_with_a_callback_releases_the_hook():
    _run_in_thread(lambda: hook.set_callback(Recorder()))
    gc.collect()
    assert hook.state().active_threads == 0
    assert hook.state().installed == "absent"


# -- memory -----------------------------------------------------------------------------------


def test_cache_is_freed_with_its_code():
    namespace: dict[str, object] = {}
    exec(compile("def short_lived(x):\n    return x\n", "<short>", "exec"), namespace)
    fn = namespace.pop("short_lived")

    def check(x):
        return True

    def fast(x):
        return x

    alive = weakref.ref(check)
    before = hook.state().live_caches
    with hook.intercepting(Recorder({fn.__code__: CacheEntry(check, fast)})):
        assert fn(1) == 1
    assert hook.state().live_caches == before + 1
    del check, fn
    gc.collect()
    assert alive() is None
    assert hook.state().live_caches == before


def test_100k_cache_hits_keep_memory_flat():
    arg = object()

    def fast(x):
        return x

    hook.add_entry(plain.__code__, CacheEntry(always, fast))
    refs_before = sys.getrefcount(arg)
    with hook.intercepting(hook.RUN_ONLY):
        for _ in range(1000):  # warm up
            plain(arg)
        tracemalloc.start()
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(100_000):
            plain(arg)
        end, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert sys.getrefcount(arg) == refs_before
    assert end - start < 16 * 1024, f"memory grew by {end - start} bytes over 100k calls"


def test_100k_misses_keep_memory_flat():
    def on_miss(frame):
        return Decision.RUN

    with hook.intercepting(on_miss):
        for _ in range(1000):
            plain(1)
        tracemalloc.start()
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(100_000):
            plain(1)
        end, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert end - start < 16 * 1024


def test_reset_forgets_every_entry():
    hook.add_entry(plain.__code__, CacheEntry(always, plain))
    hook.add_entry(fact.__code__, CacheEntry(always, fact))
    hook.reset()
    assert hook.entries(plain.__code__) == [] and hook.entries(fact.__code__) == []


def test_most_recently_hit_entry_moves_to_the_front():
    def one(x):
        return 1

    def two(x):
        return 2

    hook.add_entry(plain.__code__, CacheEntry(lambda x: x == 1, one))
    hook.add_entry(plain.__code__, CacheEntry(lambda x: x == 2, two))
    assert [e.fn for e in hook.entries(plain.__code__)] == [two, one]
    with hook.intercepting(hook.RUN_ONLY):
        assert plain(1) == 1
    assert [e.fn for e in hook.entries(plain.__code__)] == [one, two]
