"""ember.capture: turn Python frames into torch.fx graphs.

Today the package holds its lowest layer, the frame hook (:mod:`ember.capture.hook`):
a PEP 523 eval-frame function that lets ember see every Python function call
on a thread, keep a per-code cache of ``(check_fn, fn)`` entries, and run
``fn`` in place of the original frame when ``check_fn`` accepts its arguments.
The bytecode-to-FX translator built on it arrives with issue 4.

>>> from ember.capture import hook
>>> calls = []
>>> def on_miss(frame):
...     calls.append(frame.code.co_name)
...     return hook.Decision.RUN          # run normally; a translator would return an entry
>>> def double(x):
...     return 2 * x
>>> with hook.intercepting(on_miss):
...     double(21)
42
>>> calls
['double']
"""

from ember.capture import hook

__version__ = "0.1.0"
__all__ = ["hook"]
