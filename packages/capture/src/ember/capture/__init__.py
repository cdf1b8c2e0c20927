"""ember.capture: turn Python frames into torch.fx graphs.

Two layers, bottom up:

* :mod:`ember.capture.hook`, a PEP 523 eval-frame function (a small C extension):
  it lets ember see every Python call on a thread, keeps a per-code cache of
  ``(check_fn, fn)`` entries in ``co_extra``, and runs ``fn`` in place of the frame
  when ``check_fn`` accepts its arguments.
* The translator: a symbolic interpreter over CPython 3.11 bytecode
  (``interpreter.py`` and the ``ops_*.py`` handler families) that records torch
  operations into an FX graph on fake tensors, collects the guards its assumptions
  need (``ember.guards``), breaks the graph where it cannot follow the Python
  (``breaks.py``: the rest runs in a generated resume function), and generates the
  code that replaces the frame (``codegen.py``). ``frame_compiler.FrameCompiler``
  is the hook callback that ties them together; ``ember.compiler.compile`` is its
  user-facing front.

>>> import torch
>>> from ember.capture.frame_compiler import FrameCompiler
>>> def scaled(x, lr):
...     return torch.relu(x) * lr
>>> compiler = FrameCompiler(lambda gm, inputs: gm.forward, "eager", entry_codes=(scaled.__code__,))
>>> with hook.intercepting(compiler):
...     scaled(torch.ones(2), 0.5)
tensor([0.5000, 0.5000])
>>> print(compiler.stats.compiled[0].graph.code.strip())
def forward(self, x, lr):
    relu = torch.relu(x);  x = None
    mul = relu * lr;  relu = lr = None
    return (mul,)
"""

from typing import Any

from ember.capture import hook

__version__ = "0.1.0"
__all__ = [
    "Dim",
    "ExportError",
    "ExportFormatError",
    "ExportSignature",
    "ExportedProgram",
    "export",
    "hook",
    "load",
]

# Export's names, imported on first use: ``import ember.capture`` (the hook, a cached
# call's path) does not pay for the translator.
_LAZY = {
    "Dim": "ember.capture.exporting",
    "ExportError": "ember.capture.exporting",
    "export": "ember.capture.exporting",
    "ExportFormatError": "ember.capture.export_format",
    "load": "ember.capture.export_format",
    "ExportedProgram": "ember.capture.export_program",
    "ExportSignature": "ember.capture.export_program",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ember.capture' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
