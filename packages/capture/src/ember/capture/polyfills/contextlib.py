"""``contextlib`` as plain Python the translator steps through (CPython 3.11's logic).

``@contextmanager`` functions, ``nullcontext`` and ``ExitStack`` (over context managers
with Python ``__enter__``/``__exit__``). The code after a ``@contextmanager``
generator's ``yield`` runs when the block exits, and an exception in the block is
thrown into the generator at its ``yield``, as in CPython.

>>> with NullContext(3) as three:
...     three
3
"""

from __future__ import annotations

import contextlib
from typing import Any

from ember.capture.polyfills import POLYFILLS, closure_polyfill


@contextlib.contextmanager
def _sample() -> Any:
    yield


HELPER_CODE = _sample.__code__  # the code of every function @contextmanager makes


class GeneratorContextManager:
    """What calling a ``@contextmanager`` function returns (``_GeneratorContextManager``)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen

    def __enter__(self) -> Any:
        try:
            return next(self.gen)
        except StopIteration:
            raise RuntimeError("generator didn't yield") from None

    def __exit__(self, typ: Any, value: Any, traceback: Any) -> bool:
        if typ is None:
            try:
                next(self.gen)
            except StopIteration:
                return False
            raise RuntimeError("generator didn't stop")
        if value is None:
            value = typ()
        try:
            self.gen.throw(typ, value, traceback)
        except StopIteration as exc:
            return exc is not value  # the generator returned: the exception is suppressed
        except RuntimeError as exc:
            if exc is value:
                return False
            if isinstance(value, StopIteration) and exc.__cause__ is value:
                return False
            raise
        except BaseException as exc:
            if exc is not value:
                raise
            return False
        raise RuntimeError("generator didn't stop after throw()")


@closure_polyfill(HELPER_CODE, "func")
def contextmanager_call(func: Any, *args: Any, **kwds: Any) -> GeneratorContextManager:
    """Calling a ``@contextmanager`` function: the generator, not started yet."""
    return GeneratorContextManager(func(*args, **kwds))


class NullContext:
    """``contextlib.nullcontext(enter_result=None)``."""

    def __init__(self, enter_result: Any = None) -> None:
        self.enter_result = enter_result

    def __enter__(self) -> Any:
        return self.enter_result

    def __exit__(self, *excinfo: Any) -> None:
        pass


class ExitStack:
    """``contextlib.ExitStack``: exits called last-in first-out, an exception passed on."""

    def __init__(self) -> None:
        self._exit_callbacks: list[Any] = []

    def __enter__(self) -> ExitStack:
        return self

    def enter_context(self, cm: Any) -> Any:
        result = cm.__enter__()
        self._exit_callbacks.append(cm.__exit__)
        return result

    def push(self, exit: Any) -> Any:
        self._exit_callbacks.append(exit)
        return exit

    def callback(self, callback: Any, *args: Any, **kwds: Any) -> Any:
        def _exit_wrapper(exc_type: Any, exc: Any, tb: Any) -> None:
            callback(*args, **kwds)

        self._exit_callbacks.append(_exit_wrapper)
        return callback

    def close(self) -> None:
        self.__exit__(None, None, None)

    def __exit__(self, *exc_details: Any) -> bool:
        received_exc = exc_details[0] is not None
        suppressed_exc = False
        pending_raise = False
        while self._exit_callbacks:
            cb = self._exit_callbacks.pop()
            try:
                if cb(*exc_details):
                    suppressed_exc = True
                    pending_raise = False
                    exc_details = (None, None, None)
            except BaseException as new_exc:
                exc_details = (type(new_exc), new_exc, None)
                pending_raise = True
        if pending_raise:
            raise exc_details[1]
        return received_exc and suppressed_exc


POLYFILLS.update({contextlib.nullcontext: NullContext, contextlib.ExitStack: ExitStack})
