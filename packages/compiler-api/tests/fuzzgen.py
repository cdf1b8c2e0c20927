"""Random programs for the differential and guard-soundness fuzzers (issue 16).

A program is Python source text for ``def f(a, b, c)``, drawn by Hypothesis from a grammar:
pointwise, reduction and matmul ops, views, in-place ops (also through views), ``if`` on a
tensor's value (a graph break) and on guarded facts, ``for`` loops, lists, dicts, Python
scalars, and returns that hold an input, a view of one or the same tensor twice. ``a`` and
``b`` have shape (N, M) and ``c`` shape (M,); the grammar tracks shapes symbolically, so a
program stays valid for any N, M >= 3, and may still raise where eager raises (a ``view`` of a
transposed tensor, an in-place op on an expanded one), which the fuzzers compare too.

Productions that hit a bug class issue 16 is fixing are listed in :data:`GATES` and stay off
in CI until the fix is merged; ``EMBER_FUZZ_ENABLE=all`` (or a comma list of gate names)
turns them on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st

Shape = tuple[str, ...]

# Gated productions: name -> the issue-16 bug class it hits. Remove an entry (or set
# EMBER_FUZZ_ENABLE) once the fix for its class is merged.
GATES: dict[str, str] = {}


def enabled(gate: str) -> bool:
    """Whether a gated production is on: not gated, or named by ``EMBER_FUZZ_ENABLE``."""
    if gate not in GATES:
        return True
    wanted = os.environ.get("EMBER_FUZZ_ENABLE", "")
    return wanted == "all" or gate in wanted.split(",")


INPUTS: dict[str, Shape] = {"a": ("N", "M"), "b": ("N", "M"), "c": ("M",)}

# Templates keep the shape; {x} is a tensor variable.
UNARY = [
    "torch.sin({x})",
    "{x}.tanh()",
    "torch.relu({x})",
    "{x} * 2.5",
    "{x}.abs() + 1",
    "torch.sigmoid({x})",
    "-{x}",
    "torch.clamp({x}, -0.5, 0.5)",
    "{x}.cos() - 0.25",
    "torch.nn.functional.gelu({x})",
    "{x} ** 2",
]
BINARY = [
    "{x} + {y}",
    "{x} - {y}",
    "{x} * {y}",
    "torch.maximum({x}, {y})",
    "torch.where({x} > {y}, {x}, {y})",
    "{x} / ({y}.abs() + 1)",
    "torch.add({x}, {y}, alpha=2)",
]
INPLACE_BINARY = ["{x}.add_({y})", "{x}.mul_({y})", "{x}.copy_({y})", "{x} += {y}", "{x}.sub_({y})"]
INPLACE_UNARY = [
    "{x}.mul_(2)",
    "{x}.zero_()",
    "{x}.clamp_(-1, 1)",
    "{x}.sin_()",
    "{x}.add_(1)",
    "{x}.fill_(0.5)",
    "{x}.relu_()",
]
CONDITIONS = [
    "True",
    "{x}.shape[0] > 3",
    "{x}.dim() == 2",
    "G_FLAG",
    "{x}.is_contiguous()",
    "{x}.requires_grad",
    "{x}.dtype == torch.float64",
    "torch.is_grad_enabled()",
]


# Views whose in-place writes hit a known bug: (text in the expression, gate).
RISKY_VIEWS = [
    (".expand(", "inplace_expanded"),
    (".view(-1)", "inplace_flat_view"),
    (".reshape(-1)", "inplace_flat_view"),
]


def _flat(shape: Shape) -> str:
    return "*".join(shape) if shape else "1"


def _broadcast(x: Shape, y: Shape) -> Shape | None:
    """The broadcast shape of x and y, if both have one for every N, M."""
    out: list[str] = []
    for i in range(1, max(len(x), len(y)) + 1):
        dx = x[-i] if i <= len(x) else "1"
        dy = y[-i] if i <= len(y) else "1"
        if dx != dy and "1" not in (dx, dy):
            return None
        out.append(dx if dy == "1" else dy)
    return tuple(reversed(out))


@dataclass
class Builder:
    """The program being drawn: its lines and the live variables with their shapes."""

    draw: st.DrawFn
    lines: list[str] = field(default_factory=list)
    depth: int = 0
    tensors: dict[str, Shape] = field(default_factory=lambda: dict(INPUTS))
    views: set[str] = field(default_factory=lambda: set(INPUTS))  # inputs and their views
    risky: dict[str, str] = field(default_factory=dict)  # var -> gate for writing it in place
    prebreak: set[str] = field(default_factory=set)  # made before a graph break (or views)
    roots: dict[str, str] = field(default_factory=dict)  # view -> the tensor it views
    lists: dict[str, list[tuple[str, Shape]]] = field(default_factory=dict)  # (var, shape)
    dicts: dict[str, dict[str, tuple[str, Shape]]] = field(default_factory=dict)
    scalars: list[str] = field(default_factory=list)
    counter: int = 0
    fresh_dims: int = 0

    def new(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def dim(self) -> str:
        self.fresh_dims += 1
        return f"d{self.fresh_dims}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * (self.depth + 1) + line)

    def pick(
        self,
        ok: Callable[[Shape], bool] = lambda s: True,
        prefer_views: bool = False,
        exclude: set[str] | None = None,
    ) -> str:
        names = [n for n, s in self.tensors.items() if ok(s) and n not in (exclude or ())]
        if not names:
            return ""
        if prefer_views and self.draw(st.booleans()):
            names = [n for n in names if n in self.views] or names
        return self.draw(st.sampled_from(sorted(names)))

    def target(self, ok: Callable[[Shape], bool] = lambda s: True) -> str:
        """A tensor to write in place (expanded ones, and ones from before a graph break,
        behind their gates)."""
        exclude = {n for n, gate in self.risky.items() if not enabled(gate)}
        exclude |= set() if enabled("inplace_after_break") else self.prebreak
        return self.pick(ok, prefer_views=True, exclude=exclude)

    def root(self, x: str) -> str:
        return self.roots.get(x, x)

    def source(self, y: str, x: str) -> str:
        """``y`` as the source of an in-place write to ``x``: cloned where the two may
        overlap, unless that is enabled (eager's answer then depends on its loop order)."""
        if enabled("inplace_self_overlap"):
            return y
        ry, rx = self.root(y), self.root(x)
        return f"{y}.clone()" if ry == rx or (ry in INPUTS and rx in INPUTS) else y

    def graph_break(self) -> None:
        """What exists now becomes an input of the next graph."""
        self.prebreak |= set(self.tensors)

    def assign(self, expr: str, shape: Shape, view_of: str = "") -> str:
        name = self.new()
        self.emit(f"{name} = {expr}")
        self.tensors[name] = shape
        if view_of in self.views:
            self.views.add(name)
        gate = self.risky.get(view_of) or next((g for p, g in RISKY_VIEWS if p in expr), "")
        if gate:
            self.risky[name] = gate
        if view_of in self.prebreak:
            self.prebreak.add(name)
        self.roots[name] = self.root(view_of) if view_of else name
        return name


Production = Callable[[Builder], bool]


def p_unary(b: Builder) -> bool:
    x = b.pick()
    b.assign(b.draw(st.sampled_from(UNARY)).format(x=x), b.tensors[x])
    return True


def p_binary(b: Builder) -> bool:
    x = b.pick()
    y = b.pick(lambda s: _broadcast(b.tensors[x], s) is not None)
    shape = _broadcast(b.tensors[x], b.tensors[y])
    assert shape is not None
    b.assign(b.draw(st.sampled_from(BINARY)).format(x=x, y=y), shape)
    return True


def p_rebind(b: Builder) -> bool:
    """``x = op(x, y)`` keeping x's shape: loop-carried values, inputs rebound."""
    x = b.pick()
    y = b.pick(lambda s: _broadcast(b.tensors[x], s) == b.tensors[x])
    b.emit(f"{x} = " + b.draw(st.sampled_from(BINARY)).format(x=x, y=y))
    b.views.discard(x), b.risky.pop(x, None), b.prebreak.discard(x), b.roots.pop(x, None)
    return True


def p_reduce(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 1)
    shape = b.tensors[x]
    d = b.draw(st.integers(0, len(shape) - 1))
    kind = b.draw(st.sampled_from(["sum", "sum_keep", "amax", "mean", "softmax", "cumsum"]))
    rules: dict[str, tuple[str, Shape]] = {
        "sum": (f"{x}.sum({d})", shape[:d] + shape[d + 1 :]),
        "sum_keep": (f"{x}.sum({d}, keepdim=True)", (*shape[:d], "1", *shape[d + 1 :])),
        "amax": (f"{x}.amax({d})", shape[:d] + shape[d + 1 :]),
        "mean": (f"{x}.mean()", ()),
        "softmax": (f"{x}.softmax({d})", shape),
        "cumsum": (f"{x}.cumsum({d})", shape),
    }
    expr, out = rules[kind]
    b.assign(expr, out)
    return True


def p_matmul(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) == 2)
    if not x:
        return False
    sx = b.tensors[x]
    y = b.pick(lambda s: len(s) == 2 and s[1] == sx[1])
    # Unused, a matmul of two dtypes (which raises in eager) is dropped by ember: gated.
    cast = "" if enabled("dead_raising_op") else f".to({x}.dtype)"
    b.assign(f"{x} @ {y}.t(){cast}", (sx[0], b.tensors[y][0]))
    return True


def _view_rules(b: Builder, x: str, s: Shape) -> list[tuple[str, Shape]]:
    """The views applicable to a tensor of shape s: (expression, new shape)."""
    rules: list[tuple[str, Shape]] = [(f"{x}.view(-1)", (_flat(s),))]
    rules += [(f"{x}.detach()", s)]
    rules.append((f"{x}.reshape(-1)", (_flat(s),)))
    if len(s) <= 2:
        rules += [(f"{x}.unsqueeze(0)", ("1", *s)), (f"{x}.expand(2, *{x}.shape)", ("2", *s))]
    if len(s) >= 1:
        rules += [(f"{x}[1:]", (f"({s[0]}-1)", *s[1:])), (f"{x}.narrow(-1, 1, 2)", (*s[:-1], "2"))]
    if len(s) >= 2:
        rules += [(f"{x}.transpose(0, -1)", (s[-1], *s[1:-1], s[0])), (f"{x}[0]", s[1:])]
        rules += [(f"{x}[:, ::2]", (s[0], b.dim(), *s[2:])), (f"{x}[..., 1]", s[:-1])]
    if len(s) == 2:
        rules += [(f"{x}.t()", (s[1], s[0])), (f"{x}.diagonal()", (b.dim(),))]
        rules += [(f"{x}.view({x}.shape[1], {x}.shape[0])", (s[1], s[0]))]
    if len(s) == 3:
        rules += [(f"{x}.permute(2, 0, 1)", (s[2], s[0], s[1]))]
    if s and s[0] == "1":
        rules += [(f"{x}.squeeze(0)", s[1:])]
    return rules


def p_view(b: Builder) -> bool:
    x = b.pick(prefer_views=True)
    expr, shape = b.draw(st.sampled_from(_view_rules(b, x, b.tensors[x])))
    b.assign(expr, shape, view_of=x)
    return True


def p_inplace(b: Builder) -> bool:
    x = b.target()
    if not x:
        return False
    if b.draw(st.booleans()):
        b.emit(b.draw(st.sampled_from(INPLACE_UNARY)).format(x=x))
        return True
    y = b.pick(lambda s: _broadcast(b.tensors[x], s) == b.tensors[x])
    b.emit(b.draw(st.sampled_from(INPLACE_BINARY)).format(x=x, y=b.source(y, x)))
    return True


def p_setitem(b: Builder) -> bool:
    x = b.target(lambda s: len(s) >= 1)
    if not x:
        return False
    s = b.tensors[x]
    y = b.pick(lambda t: _broadcast(s[1:], t) == s[1:])
    y = b.source(y, x) if y else "1.0"
    b.emit(b.draw(st.sampled_from([f"{x}[0] = {y}", f"{x}[..., 0] = 1.5", f"{x}[:1] *= 2"])))
    return True


def p_metadata_inplace(b: Builder) -> bool:
    """``t_``/``unsqueeze_``: change a tensor's own shape, so only outside of blocks."""
    if b.depth or not enabled("metadata_inplace"):
        return False
    x = b.target(lambda s: len(s) == 2)
    if not x or (x in INPUTS and not enabled("metadata_inplace_input")):
        return False
    held = [v for items in b.lists.values() for v, _ in items]
    if x in held + [v for d in b.dicts.values() for v, _ in d.values()]:
        return False  # a container would see the new shape too
    s = b.tensors[x]
    expr, shape = b.draw(
        st.sampled_from([(f"{x}.t_()", (s[1], s[0])), (f"{x}.unsqueeze_(0)", ("1", *s))])
    )
    b.emit(expr)
    b.tensors[x] = shape
    return True


def _block(b: Builder, keep: bool, lo: int = 1, hi: int = 3) -> None:
    """Statements one level deeper; ``keep=False`` forgets what they defined (a branch)."""
    saved = dict(b.tensors), set(b.views), dict(b.risky), list(b.scalars), dict(b.roots)
    b.depth += 1
    for _ in range(b.draw(st.integers(lo, hi))):
        statement(b)
    b.depth -= 1
    if not keep:
        b.tensors, b.views, b.risky, b.scalars, b.roots = saved


def p_if_tensor(b: Builder) -> bool:
    """``if`` on a tensor's value: a data-dependent jump, so a graph break."""
    if b.depth >= 2:
        return False
    x = b.pick()
    test = b.draw(st.sampled_from(["{x}.sum() > 0", "({x} > 0).any()", "{x}.mean() < 0.1"]))
    b.emit(f"if {test.format(x=x)}:")
    b.graph_break()
    _block(b, keep=False)
    b.emit("else:")
    _block(b, keep=False)
    return True


def p_if_fact(b: Builder) -> bool:
    """``if`` on a fact the guards must cover: a shape, a flag, a global, grad mode."""
    if b.depth >= 2:
        return False
    x = b.pick()
    b.emit(f"if {b.draw(st.sampled_from(CONDITIONS)).format(x=x)}:")
    _block(b, keep=False)
    if b.draw(st.booleans()):
        b.emit("else:")
        _block(b, keep=False)
    return True


def p_for(b: Builder) -> bool:
    if b.depth >= 2:
        return False
    i = b.new("i")
    b.emit(f"for {i} in range({b.draw(st.integers(1, 3))}):")
    b.scalars.append(i)
    _block(b, keep=True)
    b.scalars.remove(i)
    return True


def p_try_view(b: Builder) -> bool:
    """An exception raised and caught inside the compiled function."""
    x = b.pick(prefer_views=True)
    v = b.new()
    b.emit("try:")
    b.emit(f"    {v} = {x}.view(-1)")
    b.emit("except RuntimeError:")
    b.emit(f"    {v} = {x}.reshape(-1)")
    b.tensors[v] = (_flat(b.tensors[x]),)
    b.risky[v] = b.risky.get(x, "inplace_flat_view")
    b.roots[v] = b.root(x)
    b.views.update([v] if x in b.views else [])
    b.prebreak.update([v] if x in b.prebreak else [])
    return True


def p_list(b: Builder) -> bool:
    if b.depth:
        return False
    name = b.new("L")
    items = [b.pick() for _ in range(b.draw(st.integers(1, 3)))]
    b.emit(f"{name} = [{', '.join(items)}]")
    b.lists[name] = [(x, b.tensors[x]) for x in items]
    return True


def p_list_use(b: Builder) -> bool:
    if not b.lists:
        return False
    name = b.draw(st.sampled_from(sorted(b.lists)))
    items = b.lists[name]
    kind = b.draw(st.sampled_from(["read", "append", "stack", "store"]))
    if kind == "read" or (kind == "stack" and len({s for _, s in items}) > 1):
        i = b.draw(st.integers(-len(items), len(items) - 1))
        var, shape = items[i]
        b.assign(f"{name}[{i}]", shape, view_of=var)
    elif kind == "stack":
        b.assign(f"torch.stack({name})", (str(len(items)), *items[0][1]))
    elif b.depth:
        return False  # the list's length would depend on the branch taken
    else:
        x = b.pick()
        if kind == "append":
            b.emit(f"{name}.append({x})")
            items.append((x, b.tensors[x]))
        else:
            b.emit(f"{name}[0] = {x}")
            items[0] = (x, b.tensors[x])
    return True


def p_dict(b: Builder) -> bool:
    if b.depth:
        return False
    if b.dicts and b.draw(st.booleans()):
        name = b.draw(st.sampled_from(sorted(b.dicts)))
        entries = b.dicts[name]
        if b.draw(st.booleans()):
            key = b.draw(st.sampled_from(sorted(entries)))
            b.assign(f"{name}[{key!r}]", entries[key][1], view_of=entries[key][0])
            return True
    else:
        name = b.new("D")
        b.emit(f"{name} = {{}}")
        b.dicts[name] = entries = {}
    x, key = b.pick(), b.draw(st.sampled_from(["p", "q", "r"]))
    b.emit(f"{name}[{key!r}] = {x}")
    entries[key] = (x, b.tensors[x])
    return True


def p_swap(b: Builder) -> bool:
    x = b.pick()
    y = b.pick(lambda s: s == b.tensors[x])
    b.emit(f"{x}, {y} = {y}, {x}")
    b.roots[x], b.roots[y] = b.root(y), b.root(x)
    rx, ry = b.risky.pop(x, ""), b.risky.pop(y, "")
    b.risky.update({n: g for n, g in ((x, ry), (y, rx)) if g})
    for marks in (b.views, b.prebreak):
        xv, yv = x in marks, y in marks
        marks.discard(x), marks.discard(y)
        marks.update(([x] if yv else []) + ([y] if xv else []))
    return True


def p_chunk(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 1)
    v, w = b.new(), b.new()
    b.emit(f"{v}, {w} = {x}.chunk(2, dim=-1)")
    for name in (v, w):
        b.tensors[name] = (*b.tensors[x][:-1], b.dim())
        b.roots[name] = b.root(x)
        b.views.update([name] if x in b.views else [])
        b.prebreak.update([name] if x in b.prebreak else [])
    return True


def p_scalar(b: Builder) -> bool:
    x = b.pick()
    rules = [
        "{x}.shape[0]" if b.tensors[x] else "{x}.dim()",
        "{x}.sum().item()",
        "float({x}.mean())",
    ]
    rules += [f"len({n})" for n in b.lists] + ["{x}.dim()", "G_SCALE"]
    name, rule = b.new("s"), b.draw(st.sampled_from(rules))
    b.emit(f"{name} = {rule.format(x=x)}")
    if "item" in rule or "float" in rule:
        b.graph_break()
    b.scalars.append(name)
    return True


def p_scalar_use(b: Builder) -> bool:
    if not b.scalars:
        return False
    x, s = b.pick(), b.draw(st.sampled_from(b.scalars))
    expr = b.draw(st.sampled_from(["{x} * {s}", "{x} + {s}", "{x}.add({s}, alpha=0.5)"]))
    b.assign(expr.format(x=x, s=s), b.tensors[x])
    return True


def p_create(b: Builder) -> bool:
    x = b.pick()
    s = b.tensors[x]
    rules: list[tuple[str, Shape]] = [
        (f"torch.ones_like({x})", s),
        (f"torch.zeros({x}.shape)", s),
        (f"torch.full_like({x}, 0.25)", s),
        (f"{x}.new_ones({x}.shape) * 3", s),
        ("torch.tensor(0.5)", ()),
        ("torch.ones(3)", ("3",)),
    ]
    if s:
        rules.append((f"torch.arange({x}.shape[-1]) * 1.5", (s[-1],)))
    b.assign(*b.draw(st.sampled_from(rules)))
    return True


def p_rng(b: Builder) -> bool:
    x = b.pick()
    s = b.tensors[x]
    rules = [f"torch.rand_like({x})", f"torch.randn({x}.shape)", f"{x} + torch.randn_like({x})"]
    rules.append(f"torch.nn.functional.dropout({x}, 0.5)")
    b.assign(b.draw(st.sampled_from(rules)), s)
    return True


def p_dtype(b: Builder) -> bool:
    x = b.pick(prefer_views=True)
    rules = [f"{x}.double()", f"{x}.float()", f"{x}.to(torch.float64) * 0.1", f"{x}.contiguous()"]
    rules += [f"{x}.clone()", f"{x}.type_as(c)"]
    expr = b.draw(st.sampled_from(rules))
    b.assign(expr, b.tensors[x], view_of=x if "float()" in expr or "contiguous" in expr else "")
    return True


def p_low_precision(b: Builder) -> bool:
    x = b.pick()
    rules = [f"{x}.half() * 0.1", f"({x}.bfloat16() + 0.3).float()", f"{x}.to(torch.bfloat16)"]
    rules += [f"{x}.half().sum(-1)" if b.tensors[x] else f"{x}.half()"]
    expr = b.draw(st.sampled_from(rules))
    b.assign(expr, b.tensors[x][:-1] if "sum" in expr else b.tensors[x])
    return True


def p_grad_mode(b: Builder) -> bool:
    if b.depth >= 2:
        return False
    b.emit(b.draw(st.sampled_from(["with torch.no_grad():", "with torch.enable_grad():"])))
    _block(b, keep=True)
    return True


def p_helper(b: Builder) -> bool:
    """Calls into user functions: inlined, one of them mutating its argument."""
    kind = b.draw(st.sampled_from(["scale", "mutate", "pair"]))
    x = b.target() if kind == "mutate" else b.pick(prefer_views=True)
    if not x:
        return False
    if kind == "pair":
        y = b.pick()
        v, w = b.new(), b.new()
        b.emit(f"{v}, {w} = h_pair({x}, {y})")
        b.tensors[v], b.tensors[w] = b.tensors[y], b.tensors[x]
        b.risky.update({n: b.risky[src] for n, src in ((v, y), (w, x)) if src in b.risky})
        b.roots[v], b.roots[w] = b.root(y), b.root(x)
        for marks in (b.views, b.prebreak):
            marks.update(n for n, src in ((v, y), (w, x)) if src in marks)
        return True
    b.assign(f"h_{kind}({x})", b.tensors[x], view_of=x if kind == "mutate" else "")
    return True


def p_global(b: Builder) -> bool:
    x = b.pick()
    b.assign(f"{x} * G_SCALE", b.tensors[x])
    return True


# name -> (production, weight). Simple productions first: Hypothesis shrinks towards them.
PRODUCTIONS: dict[str, tuple[Production, int]] = {
    "unary": (p_unary, 4),
    "binary": (p_binary, 4),
    "view": (p_view, 5),
    "inplace": (p_inplace, 4),
    "reduce": (p_reduce, 2),
    "matmul": (p_matmul, 1),
    "rebind": (p_rebind, 2),
    "setitem": (p_setitem, 2),
    "scalar": (p_scalar, 1),
    "scalar_use": (p_scalar_use, 1),
    "create": (p_create, 1),
    "dtype": (p_dtype, 1),
    "global": (p_global, 1),
    "swap": (p_swap, 1),
    "chunk": (p_chunk, 1),
    "list": (p_list, 1),
    "list_use": (p_list_use, 2),
    "dict": (p_dict, 1),
    "helper": (p_helper, 1),
    "try_view": (p_try_view, 1),
    "if_tensor": (p_if_tensor, 2),
    "if_fact": (p_if_fact, 2),
    "for": (p_for, 2),
    "metadata_inplace": (p_metadata_inplace, 1),
    "rng": (p_rng, 1),
    "low_precision": (p_low_precision, 1),
    "grad_mode": (p_grad_mode, 1),
}


def _choices() -> list[str]:
    return [n for n, (_, w) in PRODUCTIONS.items() if enabled(n) for _ in range(w)]


def statement(b: Builder) -> None:
    """One statement from the grammar (a production that does not apply is drawn again)."""
    choices = _choices()
    for _ in range(8):
        if PRODUCTIONS[b.draw(st.sampled_from(choices))][0](b):
            return
    p_unary(b)


def p_return(b: Builder) -> None:
    """Return 1-4 things: tensors (inputs and views of them likely), containers, scalars."""
    things: list[str] = []
    for _ in range(b.draw(st.integers(1, 4))):
        pool = sorted(b.tensors) + sorted(b.lists) + sorted(b.dicts) + b.scalars
        if b.draw(st.booleans()):
            pool = sorted(b.views) or pool
        things.append(b.draw(st.sampled_from(pool)))
    form = b.draw(st.sampled_from(["tuple", "single", "list", "dict"]))
    if form == "single":
        b.emit(f"return {things[0]}")
    elif form == "dict":
        b.emit("return {" + ", ".join(f"'o{i}': {t}" for i, t in enumerate(things)) + "}")
    else:
        listed = ", ".join(things)
        b.emit(f"return ({listed},)" if form == "tuple" else f"return [{listed}]")


PRELUDE = """import torch

G_FLAG = True
G_SCALE = 0.5


def h_scale(t, k=2.0):
    return t * k + 1


def h_mutate(t):
    t.add_(1)
    return t


def h_pair(t, u):
    return u, t


def f(a, b, c):
"""


@st.composite
def programs(draw: st.DrawFn, max_statements: int = 8) -> str:
    """The source text of a module defining ``f(a, b, c)`` (and the helpers it may call)."""
    b = Builder(draw)
    for _ in range(draw(st.integers(1, max_statements))):
        statement(b)
    p_return(b)
    return PRELUDE + "\n".join(b.lines) + "\n"
