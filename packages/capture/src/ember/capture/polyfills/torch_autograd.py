"""``torch.autograd``'s profiler labels, as compiled code sees them.

``record_function(name)`` marks a block for the autograd profiler. torch's own code
wraps hot paths in it (every ``Optimizer.step``, DDP's forward), and run natively its
``__enter__`` would end the graph. Inside a graph the label has no operation to name
(the graph runs as one kernel sequence), so the block is traced as a plain ``with``:
the label is not recorded while compiled code runs, as with ``torch.compile``.

>>> with RecordFunction("step") as label:
...     label.name
'step'
"""

from __future__ import annotations

from typing import Any

import torch.autograd.profiler

from ember.capture.polyfills import polyfill


@polyfill(torch.autograd.profiler.record_function)
class RecordFunction:
    """``torch.autograd.profiler.record_function(name, args=None)``: a label, not recorded."""

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name = name
        self.args = args

    def __enter__(self) -> RecordFunction:
        return self

    def __exit__(self, *excinfo: Any) -> None:
        pass
