"""The ``ShapeEnv`` capture makes its symbols in, apart from :mod:`ember.capture.shapes` so that
marking dims and a cached call do not import sympy and torch's symbolic_shapes.

>>> QuietShapeEnv().guards
[]
"""

from __future__ import annotations

from torch._guards import SLoc
from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["QuietShapeEnv"]


class QuietShapeEnv(ShapeEnv):
    """A ``ShapeEnv`` that does not look for the user's source line of each symbol and guard.

    torch's walks the stack past a list of framework files, and building that list the
    first time imports many of torch's modules (its own compilers' among them): 0.25-0.3 s
    of the first symbolic compile in each process, warm disk caches or not; ember imports
    none of them. ember records the user's line of each guard itself
    (:meth:`ember.capture.shapes.Shapes.note_where`), so torch's location adds nothing.

    >>> QuietShapeEnv()._get_stack_summary()[0].framework_loc
    'ember.capture'
    """

    def _get_stack_summary(
        self, is_debug: bool = False, framework_loc: str | None = None
    ) -> tuple[SLoc, str]:
        return SLoc(framework_loc or "ember.capture", None), ""
