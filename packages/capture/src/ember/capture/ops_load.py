"""Handlers that move values between the stack and names: locals, globals, cells, attributes."""

from __future__ import annotations

import builtins
import sys

from ember.capture import guarding
from ember.capture.attrs import delete_attr, load_attr, store_attr
from ember.capture.builder import TRUSTED_MODULE_PREFIXES, wrap
from ember.capture.calls import materialize
from ember.capture.interpreter import handler
from ember.capture.tracer import FrameState, Instr, Unsupported
from ember.capture.values import EMPTY, NULL, CellV, Const, Lazy, Value


@handler("LOAD_CONST")
def LOAD_CONST(fs: FrameState, inst: Instr) -> None:
    fs.push(wrap(fs.tracer, inst.argval, None))


@handler("LOAD_FAST")
def LOAD_FAST(fs: FrameState, inst: Instr) -> None:
    name = inst.argval
    if name not in fs.locals:
        raise Unsupported(f"local variable {name!r} referenced before assignment", "name")
    value = fs.locals[name]
    if isinstance(value, Lazy):
        value = materialize(fs, value)
        fs.locals[name] = value
    fs.push(value)


@handler("STORE_FAST")
def STORE_FAST(fs: FrameState, inst: Instr) -> None:
    fs.locals[inst.argval] = fs.pop()


@handler("DELETE_FAST")
def DELETE_FAST(fs: FrameState, inst: Instr) -> None:
    fs.locals.pop(inst.argval, None)


@handler("LOAD_GLOBAL")
def LOAD_GLOBAL(fs: FrameState, inst: Instr) -> None:
    name = inst.argval
    if inst.arg is not None and inst.arg & 1:
        fs.push_null()
    if fs.globals_source is guarding.global_ and name in fs.tracer.global_overlay:
        fs.push(fs.tracer.global_overlay[name])  # stored earlier in this trace
        return
    if name in fs.globals:
        fs.push(wrap(fs.tracer, fs.globals[name], fs.globals_source(name)))
        return
    builtins_dict = fs.globals.get("__builtins__", builtins.__dict__)
    if not isinstance(builtins_dict, dict):
        builtins_dict = builtins_dict.__dict__
    if name not in builtins_dict:
        raise Unsupported(f"name {name!r} is not defined", "name")
    # A builtin: guarded on the name still resolving to it (no global shadows it).
    fs.tracer.guards.builtin(fs.globals_source(name), builtins_dict[name])
    fs.push(wrap(fs.tracer, builtins_dict[name], None))


@handler("MAKE_CELL")
def MAKE_CELL(fs: FrameState, inst: Instr) -> None:
    name = inst.argval
    content = fs.locals.pop(name, EMPTY)  # a cell argument holds its value until now
    fs.cells[name] = CellV(fs.tracer.heap.new(content))


@handler("COPY_FREE_VARS")
def COPY_FREE_VARS(fs: FrameState, inst: Instr) -> None:
    missing = [n for n in fs.code.co_freevars if n not in fs.cells]
    if missing:
        raise Unsupported(f"free variables {missing} have no cells", "internal")


def _cell(fs: FrameState, name: str) -> CellV:
    cell = fs.cells.get(name)
    if not isinstance(cell, CellV):
        raise Unsupported(f"no cell for {name!r}", "internal")
    return cell


@handler("LOAD_CLOSURE")
def LOAD_CLOSURE(fs: FrameState, inst: Instr) -> None:
    fs.push(_cell(fs, inst.argval))


@handler("LOAD_DEREF")
def LOAD_DEREF(fs: FrameState, inst: Instr) -> None:
    cell = _cell(fs, inst.argval)
    content = fs.tracer.heap.get(cell.ref)
    if content is EMPTY:
        raise Unsupported(f"free variable {inst.argval!r} referenced before assignment", "name")
    if isinstance(content, Lazy):
        content = materialize(fs, content)
        fs.tracer.heap.set(cell.ref, content)
    fs.push(content)


@handler("STORE_DEREF")
def STORE_DEREF(fs: FrameState, inst: Instr) -> None:
    cell = _cell(fs, inst.argval)
    value = fs.pop()
    if cell.ref in fs.tracer.heap.from_frame:  # a real cell: rebinding it is a side effect
        if fs.depth != 0 or inst.argval not in fs.code.co_freevars:
            raise Unsupported(f"assigning the closure variable {inst.argval!r}", "side-effect")
        fs.tracer.effects.append(("cell", inst.argval, value))  # the frame's own nonlocal
    fs.tracer.heap.set(cell.ref, value)


@handler("STORE_GLOBAL")
def STORE_GLOBAL(fs: FrameState, inst: Instr) -> None:
    value = fs.pop()
    if fs.globals_source is not guarding.global_:
        raise Unsupported("assigning a global of another module", "side-effect")
    fs.tracer.global_overlay[inst.argval] = value
    fs.tracer.effects.append(("global", inst.argval, value))


@handler("STORE_ATTR")
def STORE_ATTR(fs: FrameState, inst: Instr) -> None:
    obj, value = fs.pop(), fs.pop()
    store_attr(fs, obj, inst.argval, value)


@handler("IMPORT_NAME")
def IMPORT_NAME(fs: FrameState, inst: Instr) -> None:
    fromlist, level = fs.pop(), fs.pop()
    name = inst.argval
    if not (isinstance(level, Const) and level.value == 0 and name in sys.modules):
        raise Unsupported(f"importing {name!r} (not imported yet, or relative)", "import")
    wanted_leaf = isinstance(fromlist, Const) and fromlist.value
    bound = name if wanted_leaf else name.partition(".")[0]
    # An import of a loaded module only binds it: the module is reached as sys.modules[name]
    # (guarded by identity, as is what is read from it), unless it is trusted like torch.
    source = guarding.item(guarding.sources.ModuleGlobal("sys", "modules"), bound)
    module = sys.modules[bound]
    trusted = name.partition(".")[0] in TRUSTED_MODULE_PREFIXES
    fs.push(wrap(fs.tracer, module, None if trusted else source))


@handler("IMPORT_FROM")
def IMPORT_FROM(fs: FrameState, inst: Instr) -> None:
    fs.push(load_attr(fs, fs.peek(), inst.argval))


@handler("LOAD_ATTR")
def LOAD_ATTR(fs: FrameState, inst: Instr) -> None:
    fs.push(load_attr(fs, fs.pop(), inst.argval))


@handler("DELETE_ATTR")
def DELETE_ATTR(fs: FrameState, inst: Instr) -> None:
    delete_attr(fs, fs.pop(), inst.argval)


@handler("LOAD_METHOD")
def LOAD_METHOD(fs: FrameState, inst: Instr) -> None:
    # 3.11 pushes [method, self] for a plain method and [NULL, attr] otherwise; ember
    # always pushes [NULL, value]: a MethodV already carries its self.
    obj = fs.pop()
    value: Value = load_attr(fs, obj, inst.argval)
    fs.push(NULL)
    fs.push(value)
