"""``OptimizedModule``: what ``compile(module)`` returns, a module that behaves like torch's.

The wrapper registers the original module as its one child, ``_orig_mod``, exactly as
``torch.compile``'s ``OptimizedModule`` does, so that everything ``nn.Module`` does by
walking children works unchanged: ``state_dict()`` keys start with ``_orig_mod.`` (a
checkpoint saved from a ``torch.compile``'d module loads here and back), ``.to()`` and
``.train()`` reach the original and return the wrapper, and hooks registered on the wrapper
run around the original's call, whose own hooks run inside it. Attributes the wrapper does
not have are read from and written to the original.

Pickling (``pickle``, ``torch.save``) and ``copy.deepcopy`` save the original module, the
wrapper's own ``nn.Module`` state (its hooks) and the arguments given to ``compile``;
loading compiles the loaded module again with them. Compiled code is never saved: the
first call after loading captures again.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.capture.frame_compiler import FrameCompiler, Stats

__all__ = ["CompileSettings", "OptimizedModule"]


@dataclass(frozen=True, slots=True)
class CompileSettings:
    """The arguments ``compile(module, ...)`` was given: what a pickled
    :class:`OptimizedModule` keeps so that loading compiles the same way again.

    >>> CompileSettings("eager").arguments()["backend"]
    'eager'
    """

    backend: Any  # a registered name or a (gm, example_inputs) -> callable
    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # a copy, made at compile()

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``compile`` that these settings stand for."""
        return {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
            "mode": self.mode,
            "options": dict(self.options) or None,
        }


# What OptimizedModule keeps in its __dict__ besides nn.Module's own state: never pickled
# (the compiler holds code objects and graphs), rebuilt by compile() on load.
_OWN = frozenset({"_orig_mod", "_compiler", "_call", "_settings", "_ready", "training"})
# Names a write to the wrapper sets on the wrapper itself rather than on the original.
_WRAPPER_NAMES = _OWN | {"forward", "__dict__"}


class OptimizedModule(torch.nn.Module):
    """What ``compile(module)`` returns: an ``nn.Module`` whose ``forward`` is compiled.

    It behaves as ``torch.compile``'s ``OptimizedModule``: the original module is its child
    ``_orig_mod`` (so ``state_dict()`` keys are prefixed ``_orig_mod.``), ``.to()``,
    ``.train()``/``.eval()`` reach the original and return the wrapper, attributes it lacks
    are read from and written to the original, and hooks on both run. ``pickle``,
    ``torch.save`` and ``copy.deepcopy`` save the original module and the ``compile``
    arguments, and load a compiled module again.

    >>> import pickle, torch, ember.compiler
    >>> lin = torch.nn.Linear(2, 2)
    >>> opt = ember.compiler.compile(lin, backend="eager")
    >>> opt._orig_mod is lin, list(opt.state_dict())
    (True, ['_orig_mod.weight', '_orig_mod.bias'])
    >>> opt.eval() is opt, lin.training
    (True, False)
    >>> again = pickle.loads(pickle.dumps(opt))
    >>> type(again).__name__, torch.equal(again(torch.ones(2)), lin(torch.ones(2)))
    ('OptimizedModule', True)
    """

    _orig_mod: torch.nn.Module
    _compiler: FrameCompiler
    _call: Callable[..., Any]
    _settings: CompileSettings

    def __init__(
        self,
        module: torch.nn.Module,
        compiler: FrameCompiler,
        call: Callable[..., Any],
        settings: CompileSettings,
    ) -> None:
        # first: nn.Module.__init__ writes `training`, which this class forwards to the original
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_ready", False)
        super().__init__()
        self._modules["_orig_mod"] = module  # a child, as torch's: `_orig_mod.` keys
        for name, value in (("_compiler", compiler), ("_call", call), ("_settings", settings)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_ready", True)
        self.training = module.training  # the copy in __dict__ (see the setter)

    @property
    def stats(self) -> Stats:
        """Graphs compiled and frames that ran eagerly (with reasons), so far."""
        return self._compiler.stats

    @property
    def training(self) -> bool:
        """The original module's ``training`` flag: the wrapper has none of its own."""
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        if self.__dict__.get("_ready"):  # nn.Module.__init__'s default is not the original's
            self._orig_mod.training = value
        # a copy where nn.Module keeps it, for code that reads the instance dict (ember's
        # module guards do); reads of `.training` go to the original, even after a direct
        # `_orig_mod.eval()`, and no compiled code reads the wrapper's own flag
        self.__dict__["training"] = self._orig_mod.training

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the original module (its hooks included) with ember's frame hook on."""
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":  # moved to _modules by an assignment, as in torch
            return self.__dict__["_modules"]["_orig_mod"]
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(type(self), name) or name in _WRAPPER_NAMES:
            super().__setattr__(name, value)  # e.g. `training`, or replacing `forward`
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if hasattr(type(self), name) or name in _WRAPPER_NAMES:
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def __len__(self) -> int:
        if not hasattr(type(self._orig_mod), "__len__"):
            raise TypeError(f"{type(self._orig_mod).__name__} does not support len()")
        return len(self._orig_mod)  # type: ignore[arg-type]

    def __dir__(self) -> list[str]:
        theirs = dir(self._orig_mod)
        known = set(theirs)
        return theirs + [name for name in object.__dir__(self) if name not in known]

    def _wrapper_state(self) -> dict[str, Any]:
        """The wrapper's own nn.Module state: its hooks, and anything registered on it."""
        state = {k: v for k, v in self.__dict__.items() if k not in _OWN}
        state["_modules"] = {k: v for k, v in self._modules.items() if k != "_orig_mod"}
        return state

    def __reduce__(self) -> tuple[Any, ...]:
        _check_picklable(self._settings)
        return (_load, (self._orig_mod, self._settings.arguments()), self._wrapper_state())

    def __setstate__(self, state: dict[str, Any]) -> None:
        modules = {"_orig_mod": self._orig_mod, **state.get("_modules", {})}
        self.__dict__.update({**state, "_modules": modules})

    def __copy__(self) -> OptimizedModule:
        new = _load(self._orig_mod, self._settings.arguments())
        new.__setstate__(self._wrapper_state())
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimizedModule:
        # the backend is configuration, shared (a lambda backend copies too); the rest is copied
        new = _load(copy.deepcopy(self._orig_mod, memo), self._settings.arguments())
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self._wrapper_state(), memo))
        return new


def _load(module: torch.nn.Module, arguments: dict[str, Any]) -> OptimizedModule:
    """Compile a loaded (or copied) module again with the ``compile`` arguments it was saved
    with. Named in every pickle of an OptimizedModule: keep its name and arguments."""
    from ember.compiler.wrap import compile  # wrap imports this module

    compiled = compile(module, **arguments)
    assert isinstance(compiled, OptimizedModule)
    return compiled


def _check_picklable(settings: CompileSettings) -> None:
    """Refuse, naming the argument, to pickle settings that cannot be loaded back: the
    pickler's own error would name only a lambda or a local function."""
    checked: dict[str, Any] = {"options": settings.options}  # a name is looked up on load
    if not isinstance(settings.backend, str):
        checked = {"backend": settings.backend, **checked}
    for what, value in checked.items():
        try:
            pickle.dumps(value)
        except Exception as e:  # any pickling failure: PicklingError, AttributeError, TypeError
            raise pickle.PicklingError(
                f"cannot pickle this compiled module: its {what} {value!r} cannot be pickled"
                f" ({type(e).__name__}: {e}). Compile with a registered backend name or a"
                " module-level function, or save the original module (`._orig_mod`) and"
                " compile it again after loading"
            ) from e
