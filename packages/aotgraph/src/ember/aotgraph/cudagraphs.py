"""CUDA graphs around compiled graphs: record once per shape, then replay.

A compiled graph launches many small kernels; on a GPU each launch costs a few
microseconds of CPU time, which is the whole cost of a small model. A CUDA graph
records the launches once and replays them with one call. :func:`cudagraphify`
wraps a compiled graph (``fn(*inputs) -> list of outputs``) so that:

1. the first call with a given shape runs ``fn`` as it is (the warm-up: lazy
   initialisation, cuBLAS workspaces and Triton's JIT happen outside a capture);
2. the second records ``fn`` into a :class:`torch.cuda.CUDAGraph` and replays it;
3. later calls copy the inputs into the graph's own input buffers and replay.
   Parameters (and the ``static`` inputs) are read where they are, never copied:
   their addresses are part of the shape key, so a moved parameter records again.
   Inputs that are outputs of a graph in the same :class:`Pool` (the saved
   tensors a backward graph gets from its forward graph) are read in place too.

The outputs of a replay live in the graph's memory, which the next replay of the
same graph overwrites. As torch's ``reduce-overhead`` does, each replay returns
fresh tensors over that memory, and the returned tensors of an earlier replay
that are still alive at the next one are marked: using one afterwards raises an
error that says so (``copy_outputs=True`` returns copies instead). Memory that
something else still holds (a view of an output, the copy autograd saved for a
backward that has not run yet) cannot be marked, so that call runs ``fn`` as it
is instead of replaying over it. The graphs of a forward/backward pair share one
:class:`Pool`; since a graph recorded later may put its outputs where an earlier
one keeps scratch values, a replay checks the outputs of the graphs recorded
after it as well.

A graph runs as it is (no graph, with the reason in :attr:`CUDAGraphed.fallback`)
when an input or output is not on one CUDA device, when the capture fails (an op
that synchronises with the host, such as ``.item()`` or ``nonzero``), or once it
has recorded ``max_records`` shapes.

>>> g = cudagraphify(lambda x: [x * 2])
>>> g(torch.ones(2))  # CPU tensors: no CUDA graph, ``fn`` runs as it is
[tensor([2., 2.])]
>>> g.fallback
'input 0 is on cpu, not on a CUDA device'
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ember.aotgraph.hints import mark_input_updates
from ember.aotgraph.log import LOG

__all__ = ["ROLES", "CUDAGraphed", "Pool", "cudagraph_compiler", "cudagraphify", "unfit"]

# ops a CUDA graph cannot hold: they wait for the device or make sizes from values
HOST_SYNC = frozenset(
    {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item", "equal"}
)

# what a graph is to the runtime: a training forward's outputs include the values saved
# for its backward, which a backward graph then reads
ROLES = ("inference", "forward", "backward")

# torch's constructor of a CUDA tensor over a storage, in one call (CUDA builds of torch)
_FROM_STORAGE = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)

STALE = (
    "this tensor is an output of an ember CUDA graph that a later replay has overwritten"
    " (mode='reduce-overhead'). Clone the output before calling the compiled function"
    " again, or ask for copies: options={'inductor.cudagraph_copy_outputs': True} with"
    " the inductor backend, options={'copy_outputs': True} with backend='cudagraphs'"
)


class Pool:
    """One CUDA memory pool shared by the graphs recorded into it (a forward graph and
    its backward graph), in the order they were recorded.

    >>> Pool().records
    []
    """

    def __init__(self) -> None:
        self.handle: Any = None  # torch.cuda.graph_pool_handle(), made at the first record
        self.records: list[weakref.ref[_Record]] = []

    def graph_handle(self) -> Any:
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
        return self.handle

    def add(self, record: _Record) -> None:
        self.records = [r for r in self.records if r() is not None]
        self.records.append(weakref.ref(record))

    def owns(self, ptr: int) -> bool:
        """Whether address ``ptr`` lies in an output of a graph recorded here."""
        return any(rec is not None and rec.owns(ptr) for rec in (r() for r in self.records))

    def backward_reads(self, args: Sequence[Any]) -> None:
        """A backward graph runs on ``args``: the forward replays whose outputs it reads
        no longer wait for it."""
        for rec in (r() for r in self.records):
            if rec is not None and rec.pending:
                ptrs = (a.data_ptr() for a in args if isinstance(a, torch.Tensor))
                rec.pending = not any(rec.owns(p) for p in ptrs)

    def release(self, record: _Record) -> bool:
        """Before ``record`` replays: the live outputs of it and of every graph recorded
        after it (which may sit in its scratch memory) become errors to use; False (and
        nothing marked) if memory they are in is held by more than those outputs."""
        after = [r for r in (ref() for ref in self.records) if r is not None]
        after = after[after.index(record) :] if record in after else [record]
        if any(rec.awaits_backward() or rec.held_elsewhere() for rec in after):
            return False
        for rec in after:
            rec.mark_live_outputs()
        return True


@dataclass(frozen=True, slots=True)
class _Out:
    """How a replay rebuilds one output: over storage ``storage`` (an index into the
    record's output storages), or over input ``input``'s memory, or a plain value."""

    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    dtype: torch.dtype | None = None
    storage: int = -1
    input: int = -1
    value: Any = None
    meta: dict[str, Any] | None = None  # for torch's one-call constructor, where it has one


@dataclass(eq=False)
class _Record:
    """One recorded graph: its input buffers, its outputs' layout, the live tensors of
    its last replay."""

    graph: Any  # torch.cuda.CUDAGraph
    device: torch.device
    # (input, where its values go, span): the graph's input itself, or (span) a flat buffer
    # over its memory span, for inputs whose strides skip or repeat memory
    copies: list[tuple[int, torch.Tensor, bool]]
    borrowed: list[tuple[int, int]]  # (input, address) read in place from the pool
    outputs: list[torch.Tensor]  # kept: their memory stays the graph's
    storages: list[tuple[int, int]]  # (address, bytes) of each output storage
    plan: list[_Out]
    single: bool  # fn returned one tensor, not a list
    # the last replay's storages (held here, so each counts one holder for this record),
    # and its returned tensors with the storage each is over
    live: list[Any] = field(default_factory=list)
    returned: list[tuple[weakref.ref[torch.Tensor], int]] = field(default_factory=list)
    pending: bool = False  # a forward replay whose backward has not run yet

    def awaits_backward(self) -> bool:
        """Whether the last replay's outputs may still be saved for a backward that has not
        run (autograd keeps them as the tensors returned, which cannot be told apart from
        the caller's)."""
        return self.pending and any(ref() is not None for ref, _ in self.returned)

    def owns(self, ptr: int) -> bool:
        return any(start <= ptr < start + n for start, n in self.storages)

    def held_elsewhere(self) -> bool:
        """Whether a storage of the last replay has holders besides this record and the
        tensors it returned (each holds it once)."""
        known = [1] * len(self.live)
        for ref, k in self.returned:
            known[k] += ref() is not None
        return any(
            torch._C._storage_Use_Count(s._cdata) > n for s, n in zip(self.live, known, strict=True)
        )

    def mark_live_outputs(self) -> None:
        """The returned tensors still alive give an error when used (their memory is
        about to be overwritten); the storages are then unheld."""
        for ref, _ in self.returned:
            t = ref()
            if t is not None:
                torch._C._set_storage_access_error_msg(t, STALE)
        self.live, self.returned = [], []


class CUDAGraphed:
    """``fn`` replayed from CUDA graphs, one per input shape (see the module's text).

    >>> g = CUDAGraphed(lambda x: [x + 1], Pool())
    >>> g(torch.zeros(1)), g.fallback
    ([tensor([1.])], 'input 0 is on cpu, not on a CUDA device')
    """

    def __init__(
        self,
        fn: Callable[..., Sequence[Any]],
        pool: Pool,
        *,
        static: Sequence[int] = (),
        copy_outputs: bool = False,
        max_records: int = 8,
        role: str = "inference",
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role={role!r}: choose one of {ROLES}")
        self.fn = fn
        self.role = role
        self.pool = pool
        self.static = frozenset(static)
        self.copy_outputs = copy_outputs
        self.max_records = max_records
        self.records: dict[tuple[Any, ...], _Record | None] = {}  # None: warmed up only
        self.fallback = ""  # why this graph runs without CUDA graphs ("": it does not)
        self.replays = 0
        self.held = 0  # calls run as they are: an output's memory was still in use

    def __call__(self, *args: Any) -> Any:
        if self.role == "backward":
            self.pool.backward_reads(args)
        if self.fallback:
            return self.fn(*args)
        key = self._key(args)
        if key is None:
            return self.fn(*args)
        if key not in self.records:
            if len(self.records) >= self.max_records:
                return self._give_up(f"more than {self.max_records} shapes", args)
            self.records[key] = None
            return self._warm_up(args)
        record = self.records[key]
        if record is None:
            record = self._record(args)
            if record is None:
                return self.fn(*args)
            self.records[key] = record
        return self._replay(record, args)

    def _key(self, args: Sequence[Any]) -> tuple[Any, ...] | None:
        """Shapes, strides and dtypes of the inputs, values of the numbers, addresses of
        the static inputs; None (and the reason) for inputs a graph cannot take."""
        key: list[Any] = []
        device = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Generator):
                self._give_up(f"input {i} is a torch.Generator, whose state a graph cannot advance")
                return None
            if not isinstance(a, torch.Tensor):
                key.append(a if isinstance(a, int | float | bool) else type(a))
                continue
            if a.device.type != "cuda" or (device is not None and a.device != device):
                self.fallback = f"input {i} is on {a.device}, not on a CUDA device"
                if device is not None:
                    self.fallback = f"inputs on {device} and {a.device}"
                LOG.info("CUDA graphs off for this graph: %s", self.fallback)
                return None
            device = a.device
            static = i in self.static or isinstance(a, torch.nn.Parameter)
            key.append((a.shape, a.stride(), a.dtype, a.data_ptr() if static else None))
        return tuple(key)

    def _warm_up(self, args: Sequence[Any]) -> Any:
        """Run ``fn`` once as it is, with torch's synchronisation check raising: an op
        that waits for the device (``.item()``, ``nonzero``, a copy to the host) would
        fail inside a capture, and a failed capture can leave the CUDA random generator
        in capture mode. Such a graph runs as it is from then on; so does one with an
        output off the GPU."""
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            outs = self.fn(*args)
        except RuntimeError as e:
            if "synchronizing" not in str(e):
                raise
            outs = None
            why = f"it waits for the device: {str(e).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        if outs is None:
            return self._give_up(why, args)
        for j, o in enumerate([outs] if isinstance(outs, torch.Tensor) else outs):
            if isinstance(o, torch.Tensor) and o.device.type != "cuda":
                self._give_up(f"output {j} is on {o.device}")
        return outs

    def _give_up(self, why: str, args: Sequence[Any] | None = None) -> Sequence[Any]:
        self.fallback = why
        LOG.info("CUDA graphs off for this graph: %s", why)
        return self.fn(*args) if args is not None else ()

    def _record(self, args: Sequence[Any]) -> _Record | None:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        settle = getattr(self.fn, "wait_compiled", None)
        if settle is not None:  # kernels still building on a worker (ember.inductor's
            settle()  # background builds): the recording must hold them, not aten calls
        inputs, copies, borrowed = list(args), [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if i in self.static or isinstance(a, torch.nn.Parameter):
                continue
            if self.pool.owns(a.data_ptr()):
                borrowed.append((i, a.data_ptr()))
                continue
            flat = torch.empty(_span(a), dtype=a.dtype, device=device)
            flat.copy_(_flat(a))
            inputs[i] = flat.as_strided(a.shape, a.stride(), 0)
            dense = a.is_contiguous()
            copies.append((i, inputs[i] if dense else flat, not dense))
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(device)
        try:
            with torch.cuda.device(device), torch.cuda.graph(graph, pool=self.pool.graph_handle()):
                found = self.fn(*inputs)
        except Exception as e:  # an op that synchronises or reads host memory
            self._give_up(f"the capture failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            torch.cuda.synchronize(device)
            return None
        single = isinstance(found, torch.Tensor)
        outs = [found] if single else list(found)
        record = _record_of(graph, device, inputs, copies, borrowed, outs, single)
        self.pool.add(record)
        return record

    def _replay(self, record: _Record, args: Sequence[Any]) -> Any:
        for i, address in record.borrowed:
            if args[i].data_ptr() != address:  # not the pool's tensor it was recorded with
                return self.fn(*args)
        intos, sources = [], []
        for i, into, span in record.copies:
            a = args[i]
            if a.data_ptr() != into.data_ptr():
                intos.append(into)
                sources.append(_flat(a) if span else a)
        if intos:  # one call, and one kernel per dtype, for every input that moved
            torch._foreach_copy_(intos, sources)
        if not self.pool.release(record):  # an output's memory is still in use
            self.held += 1
            return self.fn(*args)
        record.graph.replay()
        self.replays += 1
        record.pending = self.role == "forward"
        storages = [
            torch._C._construct_storage_from_data_pointer(ptr, record.device, n)
            for ptr, n in record.storages
        ]
        outs = [_rebuild(o, storages, args, record) for o in record.plan]
        if self.copy_outputs:  # outputs over the caller's inputs stay views of them
            outs = [
                o.clone() if p.storage >= 0 else o for o, p in zip(outs, record.plan, strict=True)
            ]
        else:
            record.live = storages
            record.returned = [
                (weakref.ref(o), p.storage)
                for o, p in zip(outs, record.plan, strict=True)
                if p.storage >= 0
            ]
        return outs[0] if record.single else outs


def _span(t: torch.Tensor) -> int:
    """How many elements of its storage ``t`` reaches from its offset."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory span as a 1-D tensor (gaps and repeats of its strides included)."""
    return t.as_strided((_span(t),), (1,), t.storage_offset())


def _record_of(
    graph: Any,
    device: torch.device,
    inputs: list[Any],
    copies: list[tuple[int, torch.Tensor, bool]],
    borrowed: list[tuple[int, int]],
    outs: list[Any],
    single: bool,
) -> _Record:
    """The layout of each output: over one of the graph's own storages, or over an input's
    memory (an output that is an input or a view of one)."""
    base = {
        t.untyped_storage().data_ptr(): i
        for i, t in enumerate(inputs)
        if isinstance(t, torch.Tensor)
    }
    storages: dict[int, int] = {}
    sizes: list[tuple[int, int]] = []
    plan = []
    for o in outs:
        if not isinstance(o, torch.Tensor):
            plan.append(_Out(value=o))
            continue
        layout = dict(size=tuple(o.shape), stride=o.stride(), dtype=o.dtype)
        ptr = o.untyped_storage().data_ptr()
        if ptr in base:  # an input, or a view of one
            i = base[ptr]
            offset = o.storage_offset() - inputs[i].storage_offset()
            plan.append(_Out(offset=offset, input=i, **layout))  # type: ignore[arg-type]
            continue
        if ptr not in storages:
            storages[ptr] = len(sizes)
            sizes.append((ptr, o.untyped_storage().nbytes()))
        meta = dict(layout, nbytes=sizes[storages[ptr]][1], data_ptr=ptr, device=o.device)
        meta["storage_offset"] = o.storage_offset()
        plan.append(_Out(offset=o.storage_offset(), storage=storages[ptr], meta=meta, **layout))  # type: ignore[arg-type]
    return _Record(graph, device, copies, borrowed, outs, sizes, plan, single)


def _rebuild(out: _Out, storages: list[Any], args: Sequence[Any], record: _Record) -> Any:
    if out.dtype is None:
        return out.value
    if out.input >= 0:  # over the caller's input, where the graph read it
        a = args[out.input]
        return a.as_strided(out.size, out.stride, a.storage_offset() + out.offset)
    if _FROM_STORAGE is not None and out.meta is not None:
        return _FROM_STORAGE(out.meta, storages[out.storage])
    t = torch.empty(0, dtype=out.dtype, device=record.device)
    return t.set_(storages[out.storage], out.offset, out.size, out.stride)


def unfit(gm: torch.fx.GraphModule) -> str:
    """Why graph ``gm`` cannot run from a CUDA graph ("" if it can): a value on the CPU, an
    op that waits for the device, or an op that writes into an input (a graph replayed
    reads and writes its own copies of the inputs).

    >>> unfit(torch.fx.symbolic_trace(lambda x: x.nonzero()))
    'nonzero calls nonzero, which waits for the device'
    >>> unfit(torch.fx.symbolic_trace(lambda x: x.relu()))
    ''
    """
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "cpu" and node.op != "output":
            return f"{node.name} is a CPU tensor"
        if node.op not in ("call_function", "call_method"):
            continue
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        schema = getattr(node.target, "_schema", None)
        if name in HOST_SYNC:
            return f"{node.name} calls {name}, which waits for the device"
        if schema is not None and schema.is_mutable and any(a in placeholders for a in node.args):
            return f"{node.name} ({node.target}) writes into an input"
    return ""


def cudagraphify(
    fn: Callable[..., Sequence[Any]],
    pool: Pool | None = None,
    *,
    static: Sequence[int] = (),
    copy_outputs: bool = False,
) -> CUDAGraphed:
    """``fn`` (a compiled graph: positional inputs, a list of outputs) replayed from CUDA
    graphs; ``pool`` shares memory with other graphs (a forward and its backward).

    >>> cudagraphify(lambda x: [x.sum()])(torch.ones(3))
    [tensor(3.)]
    """
    return CUDAGraphed(fn, pool or Pool(), static=static, copy_outputs=copy_outputs)


def cudagraph_compiler(
    compiler: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]],
    pool: Pool,
    role: str,
    *,
    copy_outputs: bool = False,
) -> Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]:
    """An :func:`~ember.aotgraph.aot_compile` compiler for graphs of ``role`` (see
    :data:`ROLES`) whose graphs replay from CUDA graphs when their example inputs are on a
    CUDA device (others are returned as they are).

    >>> from ember.aotgraph import aot_compile
    >>> pool, as_is = Pool(), lambda gm, inputs: gm
    >>> fw, bw = (cudagraph_compiler(as_is, pool, role) for role in ("forward", "backward"))
    >>> gm = torch.fx.symbolic_trace(lambda x: x * 3)
    >>> aot_compile(gm, [torch.ones(2)], fw_compiler=fw, bw_compiler=bw)(torch.ones(2))
    tensor([3., 3.])
    """

    def compile_with_graphs(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
        if cuda and not unfit(gm):  # a replay writes its own copies of the inputs: no
            mark_input_updates(gm, {})  # new value may be written into the input instead
        compiled = compiler(gm, inputs)
        if not cuda:
            return compiled
        why = unfit(gm)
        if why:
            LOG.info("CUDA graphs off for this graph: %s", why)
            return compiled
        return CUDAGraphed(compiled, pool, copy_outputs=copy_outputs, role=role)

    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose one of {ROLES}")
    return compile_with_graphs
