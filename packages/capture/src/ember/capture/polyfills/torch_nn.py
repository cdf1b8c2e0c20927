"""``torch.nn.Module.__call__`` with forward hooks, as plain Python the interpreter traces.

torch's ``Module._call_impl`` also sets up backward hooks, reads the JIT tracing state and
runs "always called" hooks when ``forward`` raises; ember models only what a module with
forward (pre-)hooks does when it returns: the hooks run in torch's order (global before the
module's own, each dict read when its loop starts, so a forward hook registered by a
pre-hook runs), a pre-hook's result replaces the arguments, a forward hook's the result.
Modules with backward hooks are not traced (``calls._call_module``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as _module

from ember.capture.polyfills import polyfill


@polyfill(torch.nn.Module._call_impl)
def call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
    args, kwargs = _run_pre_hooks(self, args, kwargs)
    result = self.forward(*args, **kwargs)
    hooks = (*_module._global_forward_hooks.items(), *self._forward_hooks.items())
    for hook_id, hook in hooks:
        if (
            hook_id in self._forward_hooks_with_kwargs
            or hook_id in _module._global_forward_hooks_with_kwargs
        ):
            hook_result = hook(self, args, kwargs, result)
        else:
            hook_result = hook(self, args, result)
        if hook_result is not None:
            result = hook_result
    return result


def _run_pre_hooks(self: Any, args: Any, kwargs: Any) -> Any:
    hooks = (*_module._global_forward_pre_hooks.items(), *self._forward_pre_hooks.items())
    for hook_id, hook in hooks:
        if hook_id in self._forward_pre_hooks_with_kwargs:
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(
                        "forward pre-hook must return None or a tuple "
                        f"of (new_args, new_kwargs), but got {result}."
                    )
                args, kwargs = result
        else:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    return args, kwargs
