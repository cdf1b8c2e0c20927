"""ember.compiler: the public API of ember, an independent PyTorch 2-style compiler.

Wrap a function or module; its calls are captured into FX graphs, guarded,
cached, and run by a backend:

>>> import torch, ember.compiler
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> fast = ember.compiler.compile(model)
>>> x = torch.randn(3, 4)
>>> torch.allclose(fast(x), model(x))
True
>>> fast.stats.graphs, fast.stats.failures
(1, [])
>>> ember.compiler.list_backends()
['aot_eager', 'cudagraphs', 'eager', 'inductor']

A backend is any callable with the ``torch.compile`` custom-backend contract,
``(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> callable``.
"""

import sys
from typing import TYPE_CHECKING, Any

from ember.capture.frame_compiler import (
    Failure,
    FallbackWarning,
    FullGraphError,
    InternalError,
    Stats,
)
from ember.capture.frame_compiler import reset as _reset
from ember.capture.markers import (
    assume_constant_result,
    disable,
    graph_break,
    is_compiling,
)
from ember.capture.shapes import (
    MarkedDynamicError,
    mark_dynamic,
    mark_static,
    mark_unbacked,
    maybe_mark_dynamic,
)
from ember.capture.trace_rules import set_rule as set_trace_rule
from ember.compiler.artifacts import (
    ArtifactsWarning,
    LoadReport,
    SaveReport,
    load_artifacts,
    save_artifacts,
)
from ember.compiler.artifacts import load_from_environment as _load_artifacts_from_environment
from ember.compiler.autograd_graph import observe as _observe_autograd_hooks
from ember.compiler.backends import list_backends, lookup_backend, register_backend
from ember.compiler.configuration import Config, config
from ember.compiler.explain import BreakReason, ExplainOutput, explain
from ember.compiler.logs import apply_environment as _apply_log_environment
from ember.compiler.logs import set_logs
from ember.compiler.phases import CompileTimes, compile_times
from ember.compiler.phases import clear as _clear_times
from ember.compiler.reporting import clear as _clear_report
from ember.compiler.reporting import count_calls, report
from ember.compiler.repro_settings import ReproSettings
from ember.compiler.stances import RecompileError, get_stance, set_stance
from ember.compiler.wrap import CompiledFunction, OptimizedModule, compile

if TYPE_CHECKING:
    from ember.capture.calls import allow_in_graph, disallow_in_graph
    from ember.compiler.autograd_compiled import CompiledAutogradStats, compiled_autograd
    from ember.compiler.profiler import CompilationProfiler, ProfileReport
    from ember.compiler.replay_record import ReplayRecord, replay
    from ember.compiler.repro import AccuracyError

__version__ = "0.1.0"
__all__ = [
    "AccuracyError",
    "ArtifactsWarning",
    "BreakReason",
    "CompilationProfiler",
    "CompileTimes",
    "CompiledAutogradStats",
    "CompiledFunction",
    "Config",
    "ExplainOutput",
    "Failure",
    "FallbackWarning",
    "FullGraphError",
    "InternalError",
    "LoadReport",
    "MarkedDynamicError",
    "OptimizedModule",
    "ProfileReport",
    "RecompileError",
    "ReplayRecord",
    "ReproSettings",
    "SaveReport",
    "Stats",
    "allow_in_graph",
    "assume_constant_result",
    "compile",
    "compile_times",
    "compiled_autograd",
    "config",
    "count_calls",
    "disable",
    "disallow_in_graph",
    "explain",
    "get_stance",
    "graph_break",
    "is_compiling",
    "list_backends",
    "list_mode_options",
    "list_options",
    "load_artifacts",
    "lookup_backend",
    "mark_dynamic",
    "mark_static",
    "mark_unbacked",
    "maybe_mark_dynamic",
    "register_backend",
    "replay",
    "report",
    "reset",
    "save_artifacts",
    "set_logs",
    "set_stance",
    "set_trace_rule",
]

_apply_log_environment()  # EMBER_LOGS, EMBER_DEBUG_FUNCTION, EMBER_PROGRESS
_load_artifacts_from_environment()  # EMBER_ARTIFACTS: a portable pack to start from

#: ``config.list_options``: every setting as ``"section.name"``, with its value now.
list_options = config.list_options
#: ``config.list_mode_options``: what ``compile(mode=...)`` sets.
list_mode_options = config.list_mode_options


def reset() -> None:
    """Forget every compiled translation, guard cache and skip decision, and the
    times :func:`compile_times` reports and the callables :func:`report` shows.

    >>> reset()
    """
    _reset()
    _clear_times()
    _clear_report()
    if (autograd := sys.modules.get("ember.compiler.autograd_compiled")) is not None:
        autograd.reset()


# Names whose modules import capture's translator (and sympy), or are debugging tools that a
# run which does not ask for them never needs (the profiler, replay records, the repro tools
# and their minifier): imported on first use, so that ``import ember.compiler`` and a loaded
# pack's first call do not pay for them.
_LAZY = {
    "allow_in_graph": "ember.capture.calls",
    "disallow_in_graph": "ember.capture.calls",
    "compiled_autograd": "ember.compiler.autograd_compiled",  # (its module: ember.aotgraph's
    "CompiledAutogradStats": "ember.compiler.autograd_compiled",  # runtime, sympy)
    "CompilationProfiler": "ember.compiler.profiler",
    "ProfileReport": "ember.compiler.profiler",
    "ReplayRecord": "ember.compiler.replay_record",
    "replay": "ember.compiler.replay_record",
    "AccuracyError": "ember.compiler.repro",
}
# Hook registrations are watched from import on, so that compiled autograd's key sees every
# hook of a graph built after it (autograd_graph.observe; a cheap wrapper of torch's methods).
_observe_autograd_hooks()


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.compiler' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
