"""Exceptions, ``with`` blocks and generators inside compiled code, against CPython itself.

Each function runs eagerly and compiled on the same inputs: the tensors must be close, the
plain Python values (logs of side effects, in order) equal, and the exception raised (type
and message) the same. Most must be captured as one graph with no break.
"""

from __future__ import annotations

import contextlib

import torch

import ember.compiler
from ember.compiler.testing import CompileCounter, check_like_eager


def x4() -> torch.Tensor:
    return torch.arange(4.0)


# -- try / except / finally --------------------------------------------------------------------


def test_except_matches_the_raised_class():
    def f(x):
        try:
            x = x + 1
            raise ValueError("bad")
        except ValueError:
            x = x * 2
        return x

    check_like_eager(f, x4())


def test_except_that_does_not_match_lets_the_next_one_catch():
    def f(x):
        log = []
        try:
            try:
                raise KeyError("k")
            except ValueError:
                log.append("wrong")
        except LookupError:
            log.append("outer")
        return x - 1, log

    check_like_eager(f, x4())


def test_tuple_of_classes_and_bare_except():
    def f(x):
        log = []
        try:
            {}["missing"]
        except (TypeError, KeyError) as e:
            log.append(type(e).__name__)
        try:
            raise RuntimeError
        except:  # noqa: E722
            log.append("bare")
        return x.sin(), log

    check_like_eager(f, x4())


def test_except_as_reads_the_arguments_and_message():
    def f(x):
        try:
            raise ValueError("scale", 3)
        except ValueError as e:
            name, k = e.args
            text = str(e)
        return x * k, name, text

    check_like_eager(f, x4())


def test_nested_try_with_reraise_and_finally_order():
    def f(x):
        log = []
        try:
            try:
                log.append("body")
                raise IndexError("i")
            except IndexError:
                log.append("inner except")
                raise
            finally:
                log.append("inner finally")
        except IndexError as e:
            log.append(f"outer {e}")
        finally:
            log.append("outer finally")
        return x + len(log), log

    check_like_eager(f, x4())


def test_return_inside_try_runs_finally_and_keeps_the_value():
    def g(x, log):
        try:
            return x * 3
        finally:
            log.append("finally")
            x = x * 100  # does not change what was returned

    def f(x):
        log = []
        y = g(x, log)
        return y, log

    check_like_eager(f, x4())


def test_finally_on_the_exception_path_then_the_exception_reaches_the_caller():
    def g(x, log):
        try:
            raise ZeroDivisionError("zero")
        finally:
            log.append("cleanup")

    def f(x):
        log = []
        try:
            g(x, log)
        except ZeroDivisionError as e:
            log.append(str(e))
        return x.cos(), log

    check_like_eager(f, x4())


def _inner_raises(x):
    if x.dim() == 1:
        raise TypeError(f"expected 2-d, got {x.dim()}-d")
    return x


def test_exception_raised_in_an_inlined_callee_is_caught_in_the_caller():
    def f(x):
        try:
            x = _inner_raises(x)
        except TypeError as e:
            return x * 2, str(e)
        return x, ""

    check_like_eager(f, x4())


def test_raise_from_sets_the_cause():
    def f(x):
        try:
            try:
                raise KeyError("a")
            except KeyError as e:
                raise ValueError("b") from e
        except ValueError as e:
            cause = type(e.__cause__).__name__
        return x + 1, cause

    check_like_eager(f, x4())


def test_modelled_python_errors_are_caught():
    def f(x):
        log = []
        try:
            [1, 2][5]
        except IndexError:
            log.append("index")
        try:
            _ = 1 // 0
        except ZeroDivisionError as e:
            log.append(str(e))
        it = iter([x])
        next(it)
        try:
            next(it)
        except StopIteration:
            log.append("stop")
        return x * len(log), log

    check_like_eager(f, x4())


def test_an_exception_escaping_the_frame_is_raised_for_real():
    def f(x):
        y = x + 1
        try:
            raise ValueError("caught")
        except ValueError:
            pass
        raise KeyError(f"escapes {y.dim()}")

    check_like_eager(f, x4(), graphs=None)


def test_an_error_from_a_tensor_operation_is_not_caught_while_tracing():
    def f(x):
        try:
            return x @ torch.ones(3, 3)  # a shape error: only eager may decide it
        except RuntimeError:
            return x

    check_like_eager(f, torch.ones(2, 2), graphs=None)  # the frame runs eagerly, same result


# -- with blocks ---------------------------------------------------------------------------


class Recorder:
    def __init__(self, log, suppress=False):
        self.log = log
        self.suppress = suppress

    def __enter__(self):
        self.log.append("enter")
        return 10

    def __exit__(self, typ, value, tb):
        # (ember passes tb=None: a traceback does not exist while tracing)
        self.log.append(("exit", typ, None if value is None else str(value)))
        return self.suppress


def test_user_context_manager_normal_exit():
    def f(x):
        log = []
        with Recorder(log) as ten:
            log.append("body")
            x = x * ten
        return x, log

    check_like_eager(f, x4())


def test_user_context_manager_sees_the_exception_and_may_suppress_it():
    def f(x):
        log = []
        with Recorder(log, suppress=True):
            x = x + 1
            raise ValueError("swallowed")
        try:
            with Recorder(log):
                raise KeyError("kept")
        except KeyError:
            log.append("propagated")
        return x, log

    check_like_eager(f, x4())


@contextlib.contextmanager
def _tagged(log, tag):
    log.append(f"{tag} enter")
    try:
        yield tag
    except ValueError:
        log.append(f"{tag} handled")
    finally:
        log.append(f"{tag} exit")


def test_contextmanager_runs_the_code_after_yield_at_block_exit():
    def f(x):
        log = []
        with _tagged(log, "a") as tag:
            log.append(f"body {tag}")
            x = x.exp()
        log.append("after")
        return x, log

    check_like_eager(f, x4())


def test_contextmanager_receives_the_exception_at_its_yield():
    def f(x):
        log = []
        with _tagged(log, "a"):
            raise ValueError("handled inside")  # the generator catches it: suppressed
        try:
            with _tagged(log, "b"):
                raise KeyError("not handled")
        except KeyError:
            log.append("caught outside")
        return x - 2, log

    check_like_eager(f, x4())


def test_nested_with_blocks_exit_in_reverse_order():
    def f(x):
        log = []
        with _tagged(log, "outer"), Recorder(log):
            with contextlib.nullcontext(3) as three:
                x = x * three
        return x, log

    check_like_eager(f, x4())


def test_exit_stack():
    def f(x):
        log = []
        with contextlib.ExitStack() as stack:
            stack.enter_context(Recorder(log))
            stack.callback(log.append, "callback")
            log.append("body")
        return x + 1, log

    check_like_eager(f, x4())


def test_with_blocks_and_tensor_ops_are_one_graph():
    def f(x):
        log = []
        with torch.no_grad():
            y = x * 2
        with _tagged(log, "t"), Recorder(log):
            y = y + x.sin()
            try:
                with torch.enable_grad():
                    y = y * 3
                    raise ValueError("restore the mode")
            except ValueError:
                grad = torch.is_grad_enabled()
        return y.cos(), grad, log

    x = torch.randn(4, requires_grad=True)
    check_like_eager(f, x)
    assert torch.is_grad_enabled()


# -- generators ----------------------------------------------------------------------------


def _squares(x, n, log):
    for i in range(n):
        log.append(f"yield {i}")
        yield x * i
    log.append("done")
    return n


def test_generator_consumed_by_a_for_loop_interleaves_side_effects():
    def f(x):
        log = []
        total = torch.zeros_like(x)
        for y in _squares(x, 3, log):
            log.append("consume")
            total = total + y
        return total, log

    check_like_eager(f, x4())


def test_next_and_stop_iteration_value():
    def f(x):
        log = []
        g = _squares(x, 2, log)
        a = next(g)
        b = next(g)
        try:
            next(g)
        except StopIteration as e:
            returned = e.value
        return a + b, returned, next(g, "default"), log

    check_like_eager(f, x4())


def test_yield_from_passes_values_and_the_return_value():
    def outer(x, log):
        n = yield from _squares(x, 2, log)
        log.append(f"inner returned {n}")
        yield x + 100

    def f(x):
        log = []
        return list(outer(x, log)), log

    check_like_eager(f, x4())


def test_send_into_a_generator():
    def accumulate():
        total = 0
        while True:
            got = yield total
            if got is None:
                return total
            total += got

    def f(x):
        g = accumulate()
        next(g)
        g.send(2)
        last = g.send(5)
        try:
            g.send(None)
        except StopIteration as e:
            final = e.value
        return x * last, final

    check_like_eager(f, x4())


def test_generator_close_runs_its_finally():
    def gen(log):
        try:
            yield 1
            yield 2
        finally:
            log.append("closed")

    def f(x):
        log = []
        g = gen(log)
        first = next(g)
        g.close()
        log.append("after close")
        return x * first, log

    check_like_eager(f, x4())


def test_generator_left_suspended_inside_try_is_not_silently_dropped():
    def gen(log):
        try:
            yield 1
            yield 2
        finally:
            log.append("finally")  # CPython runs it when the generator is collected

    def f(x, log):
        g = gen(log)
        return x * next(g)

    log_eager: list[str] = []
    want = f(x4(), log_eager)
    compiled = ember.compiler.compile(f, backend=CompileCounter())
    log: list[str] = []
    torch.testing.assert_close(compiled(x4(), log), want)
    assert log == log_eager == ["finally"]
    assert any("left suspended" in failure.reason for failure in compiled.stats.failures)


def test_stop_iteration_inside_a_generator_becomes_runtime_error():
    def gen():
        yield 1
        raise StopIteration  # PEP 479

    def f(x):
        try:
            list(gen())
        except RuntimeError as e:
            return x + 1, str(e)
        return x, ""

    check_like_eager(f, x4())


def test_unstarted_generator_alive_at_a_break_is_made_again():
    def f(x):
        g = (v * 2 for v in (x, x + 1))
        print("break")
        return sum(g)

    compiled = ember.compiler.compile(f, backend=CompileCounter())
    torch.testing.assert_close(compiled(x4()), f(x4()))
    assert compiled.stats.breaks and compiled.stats.failures == []


def test_enumerate_and_zip_resume_a_generator_item_by_item():
    def f(x):
        log = []
        for i, y in enumerate(_squares(x, 2, log)):
            log.append(f"loop {i}")
            x = x + y
        for a, b in zip(_squares(x, 3, log), [x, x], strict=False):  # stops the generator early
            x = x + a * b
        try:
            for a, b in zip([x], _squares(x, 2, log), strict=True):
                x = x + a * b
        except ValueError as e:
            log.append(str(e))
        return x, log

    check_like_eager(f, x4())


def test_any_stops_at_the_first_true_item():
    def f(x):
        keys = ["a", "b", "missing"]
        table = {"a": 0, "b": 1}
        found = any(table[k] for k in keys)  # CPython never reads table["missing"]
        return x + found

    check_like_eager(f, x4())
