"""The signature of an exported program, as plain data that aotgraph reads without ember.capture.

``ember.capture.export`` writes its signature as JSON (``ExportSignature.to_json()``,
the ``"signature"`` object of a saved ``program.json``). aotgraph must not import
capture (the package table's arrows point one way), so it reads that same JSON into the
small schema here: :class:`IOSpec` per graph input and output, and the rest of the
signature (pytree specs, input checks, dims, relations) kept as the JSON it was.
:meth:`ProgramSignature.to_json` writes the same format back, so capture's
``ExportSignature.from_json`` reads an inference-IR signature unchanged.

The joint (training) IR adds kinds capture does not know: ``tangent`` inputs and
``gradient_to_parameter`` / ``gradient_to_user_input`` outputs.

>>> sig = ProgramSignature.from_json({
...     "inputs": [{"kind": "parameter", "name": "p_weight", "target": "weight", "leaf": None},
...                {"kind": "user_input", "name": "x", "target": None, "leaf": 0}],
...     "outputs": [{"kind": "user_output", "name": "mm", "target": None}],
...     "in_spec": "...", "out_spec": "...", "checks": [], "dims": [], "relations": [], "same": []})
>>> [(s.kind, s.name) for s in sig.inputs], sig.extra["in_spec"]
([('parameter', 'p_weight'), ('user_input', 'x')], '...')
>>> ProgramSignature.from_json(sig.to_json()) == sig
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INPUT_KINDS", "OUTPUT_KINDS", "IOSpec", "ProgramSignature"]

#: What a placeholder of an exported (or lowered) graph can be.
INPUT_KINDS = frozenset({"user_input", "parameter", "buffer", "constant_tensor", "tangent"})
#: What an item of its output tuple can be.
OUTPUT_KINDS = frozenset(
    {
        "user_output",
        "buffer_mutation",  # the buffer's new value: the caller writes it back
        "user_input_mutation",  # the same, for a user's input tensor
        "gradient_to_parameter",  # joint IR: the gradient of the parameter ``target``
        "gradient_to_user_input",  # joint IR: the gradient of the input placeholder ``target``
    }
)


@dataclass(frozen=True, slots=True)
class IOSpec:
    """One graph input or output: its ``kind``, its node's ``name`` (None for an output that is
    a constant or an unused gradient) and what it is.

    ``target``: a parameter's or buffer's fully qualified name, a constant's name, a mutated
    input's or a gradient's placeholder name, or the output a tangent belongs to.
    ``leaf``: a user input's index among the flattened ``(args, kwargs)``.

    >>> IOSpec("buffer", "b_bn_running_mean", "bn.running_mean")
    IOSpec(kind='buffer', name='b_bn_running_mean', target='bn.running_mean', leaf=None)
    """

    kind: str
    name: str | None
    target: str | None = None
    leaf: int | None = None


@dataclass(frozen=True)
class ProgramSignature:
    """Inputs and outputs of a program's graph in order, plus the rest of capture's signature.

    ``extra`` holds ``in_spec``/``out_spec`` (``torch.utils._pytree`` specs as
    ``treespec_dumps`` JSON), ``checks`` (per flattened input: ``kind`` tensor/number/
    constant, ``dtype``, ``sizes``, ``pytype``, ``value``), ``dims``, ``relations`` and
    ``same``, as JSON.
    """

    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``ExportSignature.to_json()``'s, plus the joint IR's kinds)."""
        inputs = [{"kind": s.kind, "name": s.name, "target": s.target, "leaf": s.leaf}
                  for s in self.inputs]  # fmt: skip
        outputs = [{"kind": s.kind, "name": s.name, "target": s.target} for s in self.outputs]
        return {"inputs": inputs, "outputs": outputs, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProgramSignature:
        """The signature ``data`` describes; a ``ValueError`` naming what is wrong otherwise.

        >>> ProgramSignature.from_json({"inputs": [{"kind": "weight", "name": "w"}], "outputs": []})
        Traceback (most recent call last):
        ValueError: not a program signature: input 0 has unknown kind 'weight'
        """
        try:
            inputs = tuple(_spec(d, INPUT_KINDS, "input", k) for k, d in enumerate(data["inputs"]))
            outputs = tuple(
                _spec(d, OUTPUT_KINDS, "output", k) for k, d in enumerate(data["outputs"])
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a program signature: {type(e).__name__}: {e}") from None
        extra = {k: v for k, v in data.items() if k not in ("inputs", "outputs")}
        return cls(inputs, outputs, extra)

    def inputs_of(self, *kinds: str) -> tuple[IOSpec, ...]:
        """The inputs of the given kinds, in order.

        >>> ProgramSignature((IOSpec("parameter", "p"), IOSpec("user_input", "x", leaf=0)),
        ...                  ()).inputs_of("user_input")
        (IOSpec(kind='user_input', name='x', target=None, leaf=0),)
        """
        return tuple(s for s in self.inputs if s.kind in kinds)

    def outputs_of(self, *kinds: str) -> tuple[IOSpec, ...]:
        """The outputs of the given kinds, in order."""
        return tuple(s for s in self.outputs if s.kind in kinds)


def _spec(data: Mapping[str, Any], kinds: frozenset[str], what: str, k: int) -> IOSpec:
    kind = data["kind"]
    if kind not in kinds:
        raise ValueError(f"not a program signature: {what} {k} has unknown kind {kind!r}")
    name, target, leaf = data["name"], data.get("target"), data.get("leaf")
    if not (name is None or isinstance(name, str)) or not (
        target is None or isinstance(target, str)
    ):
        raise ValueError(f"not a program signature: {what} {k} has a name or target not a string")
    if leaf is not None and (type(leaf) is not int or leaf < 0):
        raise ValueError(f"not a program signature: {what} {k} has leaf {leaf!r}")
    if kind == "user_input" and leaf is None:
        raise ValueError(f"not a program signature: user input {name!r} has no leaf")
    return IOSpec(kind, name, target, leaf)
