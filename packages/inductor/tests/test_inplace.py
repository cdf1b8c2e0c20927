"""The memory plan's in-place writes and donated extern results, checked on the schedule and
against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import ember.inductor.wrapper as inductor_wrapper
from ember.inductor import compile_graph, decompositions
from ember.inductor.ir import Extern, Ref, walk
from ember.inductor.ops import Op
from ember.inductor.scheduler import Kernel, Schedule

T = torch.Tensor


def _compile(fn: Any, *args: T, tol: float | None = None) -> tuple[Any, Schedule]:
    """``fn`` compiled (no graph cache, so the schedule is there), checked against eager
    (within ``tol``, relative and absolute, where sums of products may round otherwise)."""
    compiled = compile_graph(make_fx(fn)(*args), list(args), {"graph_cache": False})
    want = fn(*args)
    for _ in range(2):  # the second call runs on pooled buffers
        torch.testing.assert_close(compiled(*args), want, rtol=tol, atol=tol)
    sched = compiled.schedule
    assert sched is not None
    return compiled, sched


def _externs(sched: Schedule) -> list[str]:
    return [n for s in sched.steps if isinstance(s, Extern) for n in s.names]


def _stored(sched: Schedule) -> list[str]:
    """Kernel outputs that reach memory, in order."""
    return [
        s.name
        for k in sched.steps
        if isinstance(k, Kernel)
        for st in k.stages
        for s in st.stores
        if s.name not in sched.locals
    ]


def _chain(x: T, w: T) -> T:
    a = (x @ w).relu() * 2  # over the matmul's result, which nothing reads again
    b = (a @ w + a).tanh()  # over the second matmul's result (or ``a``)
    return b.sin() + 1


def test_a_pointwise_chain_writes_over_the_matmul_results_it_reads() -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    compiled, sched = _compile(_chain, x, w)
    mm0, mm1 = _externs(sched)
    a, out = _stored(sched)
    assert sched.inplace[a] == mm0 and sched.inplace[out] in (a, mm1)
    assert f"in place: {a}<-{mm0}, {out}<-{sched.inplace[out]}" in str(sched)
    # one memory under two names: the kernel must not promise gcc they do not alias
    assert f"const float* {mm0}" in compiled.source
    assert f"float* {a})" in compiled.source or f"float* {a}," in compiled.source


def test_gelu_of_a_linear_layer_takes_the_addmm_result() -> None:
    def f(x: T, w: T, b: T) -> T:
        return F.gelu(F.linear(x, w, b)) * 3

    x, w, b = torch.randn(8, 32), torch.randn(64, 32), torch.randn(64)
    _, sched = _compile(f, x, w, b)
    (mm,) = _externs(sched)
    (out,) = _stored(sched)
    assert sched.inplace == {out: mm}


def test_a_dead_extern_result_is_donated_to_a_later_kernel() -> None:
    def f(x: T, w: T, w2: T) -> T:
        h = x @ w  # dies in the next matmul
        m = h @ w2
        return torch.cat([m[1:], m[:1]]) * 2  # m read shifted: not in place; h is free

    x, w, w2 = torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16)
    compiled, sched = _compile(f, x, w, w2)
    h, _ = _externs(sched)
    (out,) = _stored(sched)
    assert sched.inplace == {} and sched.reuse == {out: h}
    assert f"{out} = {h}" in compiled.wrapper
    # torch returns the matmul's result in the layout the kernel stores, or it is restrided
    assert f"if {h}.stride() != (16, 1)" in compiled.wrapper


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda h: torch.cat([h[:, 1:], h[:, :1]], 1), id="shifted"),
        pytest.param(lambda h: h.roll(1, 0), id="rolled"),
        pytest.param(lambda h: h[:1].expand(8, 16), id="broadcast"),
        pytest.param(lambda h: h - h.mean(-1, keepdim=True), id="after-a-reduction"),
    ],
)
def test_no_write_over_a_buffer_read_at_another_point(read: Any) -> None:
    def f(x: T, w: T) -> T:
        h = x @ w
        return (h + read(h)) * 0.5  # in place would read elements already overwritten

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    _, sched = _compile(f, x, w)
    h = _externs(sched)[0]  # no extern reads it: the read at another point is a kernel's
    assert all(r.name != h for s in sched.steps if isinstance(s, Extern) for r in s.refs())
    assert sched.inplace == {}


def test_no_write_over_a_buffer_a_later_kernel_reads() -> None:
    def f(x: T, w: T) -> T:
        h = x @ w
        a = h.relu()  # h is read again below: a gets memory of its own
        return a @ w + h

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    _, sched = _compile(f, x, w)
    h = _externs(sched)[0]
    a = _stored(sched)[0]
    assert a not in sched.inplace and a not in sched.reuse
    assert h not in sched.inplace.values() or _stored(sched)[-1] in sched.inplace


def test_no_write_over_a_graph_input() -> None:
    def f(x: T, w: T) -> T:
        return (x.sin() * 2) @ w

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    before = x.clone()
    _, sched = _compile(f, x, w)
    assert sched.inplace == {} and sched.reuse == {}
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_no_write_over_a_buffer_whose_view_is_returned() -> None:
    def f(x: T, w: T) -> tuple[T, T]:
        h = x @ w
        return h.relu() * 2, h.t()  # h reaches the caller through its transpose

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    _, sched = _compile(f, x, w)
    assert sched.inplace == {} and sched.reuse == {}


def test_no_write_over_what_an_aliasing_extern_returns() -> None:
    def f(x: T) -> tuple[T, T]:
        h = x.sin() + 1
        c = torch.view_as_complex(h.view(8, 8, 2))  # externs returning views of h
        return c, torch.view_as_real(c).exp() * 2  # the caller gets c: h's memory is kept

    x = torch.randn(8, 16)
    _, sched = _compile(f, x)
    assert _externs(sched) and sched.inplace == {} and sched.reuse == {}


def test_in_place_pooled_wrapper_is_thread_safe(in_threads: Any) -> None:
    def f(x: T, w: T) -> T:
        a = (x.cos() @ w).relu() * 2  # x.cos(): pooled; a: in place over the matmul
        return (a @ w).sum(0)

    w = torch.randn(16, 16)
    compiled, sched = _compile(f, torch.randn(8, 16), w)
    assert sched.inplace and "_take(_pool)" in compiled.wrapper

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(50):
            x = torch.randn(8, 16, generator=g)
            # sums of products of ~30: eager's matmul may block differently under load
            torch.testing.assert_close(compiled(x, w), f(x, w), rtol=1e-4, atol=1e-4)

    in_threads(work)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: T) -> T:
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


@pytest.mark.slow
def test_training_an_mlp_with_layer_norm_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.aotgraph import aot_compile  # ember-inductor's own dependency

    schedules: list[Schedule] = []
    source = inductor_wrapper.wrapper_source

    def spy(sched: Schedule, kernel_args: dict[str, list[str]], **how: Any) -> Any:
        schedules.append(sched)
        return source(sched, kernel_args, **how)

    monkeypatch.setattr(inductor_wrapper, "wrapper_source", spy)  # (imported at each build)
    torch.manual_seed(0)
    model, reference = _Block(), _Block()
    reference.load_state_dict(model.state_dict())

    def kernels(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        return compile_graph(gm, inputs, {"graph_cache": False})

    # as ember.compiler's inductor backend chains them (that package is not a dependency)
    compiled = aot_compile(
        torch.fx.symbolic_trace(model),
        [torch.randn(16, 32)],
        fw_compiler=kernels,
        bw_compiler=kernels,
        decompositions=decompositions,
        cache=False,
    )
    for step in range(2):
        x = torch.randn(16, 32)
        got, want = compiled(x), reference(x)
        got.pow(2).mean().backward()
        want.pow(2).mean().backward()
        torch.testing.assert_close(got, want)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}: {name}.grad")
    forward, backward = schedules
    # the forward saves the addmm result for backward (outputs keep their memory): the
    # norm's output may go over the second matmul's result, which the residual add read two
    # stages before, never over an output; in the backward the GELU's gradient writes over a
    # dying buffer of its kernel
    outputs = {r.name for r in forward.program.outputs}
    assert not set(forward.inplace.values()) & outputs, str(forward)
    assert backward.inplace, str(backward)


def _peak_bytes(fn: Any, *args: T) -> int:
    """The most tensor memory live at once during ``fn(*args)`` (the profiler's memory events),
    above what was live before; the result is dropped inside the measured span."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        del_me = fn(*args)
        del del_me
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    live = peak = 0
    for _, n in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += n
        peak = max(peak, live)
    return peak


def _attention(x: T, w: T) -> T:
    q, k, v = (x @ w).split(64, dim=-1)  # views of the fused projection, read by an extern
    return F.scaled_dot_product_attention(q, k, v)


def _two_attentions(x: T, w: T, w2: T) -> T:
    return _attention(_attention(x, w), w2) * 2


def test_the_views_an_extern_reads_die_with_their_last_reader() -> None:
    """The first layer's q/k/v projection (768 KiB) is not alive in the second layer: the
    wrapper deletes the split's views after the attention reads them, and the unread
    results of an extern (its logsumexp) where they are made, as eager frees them."""
    x, w, w2 = torch.randn(8, 128, 64), torch.randn(64, 192), torch.randn(64, 192)
    compiled, sched = _compile(_two_attentions, x, w, w2, tol=1e-3)
    compiled(x, w, w2)
    eager = _peak_bytes(_two_attentions, x, w, w2)
    ours = _peak_bytes(compiled, x, w, w2)
    assert ours <= eager, (ours, eager)
    produced = [n for s in sched.steps if isinstance(s, Extern) for n in s.names]
    freed = {n for names in sched.frees.values() for n in names}
    outputs = {o.name for o in sched.program.outputs if isinstance(o, Ref)}
    assert set(produced) - outputs <= freed, (produced, sched.frees)


def test_a_value_summing_many_buffers_is_stored_for_its_readers() -> None:
    """A sum of three buffers that two kernels read is stored once, not recomputed by each:
    recomputed, it would keep all three alive to its last reader (a residual stream each
    layer norm sums anew)."""

    def f(a: T, b: T, c: T, w: T) -> T:
        r = (a @ w) + (b @ w) + (c @ w)  # three extern results
        return r.softmax(-1) @ w + r  # read by two kernels, a matmul between them

    a, b, c, w = (torch.randn(32, 32) for _ in range(4))
    _, sched = _compile(f, a, b, c, w, tol=1e-4)
    mm = _externs(sched)
    r = _stored(sched)[0]
    kernel = next(s for s in sched.steps if isinstance(s, Kernel))
    (store,) = [s for st in kernel.stages for s in st.stores if s.name == r]
    loads = {e.arg[0] for e in walk(store.body) if e.op is Op.LOAD}
    assert loads == set(mm[:3]), str(sched)
    later = [s for s in sched.steps if isinstance(s, Kernel) and s is not kernel]
    assert all(not set(mm[:3]) & {e.arg[0] for e in _kernel_loads(k)} for k in later)


def _kernel_loads(kernel: Kernel) -> list[Any]:
    return [e for st in kernel.stages for s in st.stores for e in walk(s.body) if e.op is Op.LOAD]


def test_no_memory_held_for_a_later_output_across_the_peak() -> None:
    """``e`` could take the memory of ``d`` (the same layout, dead before the big product),
    but holding it across the product would raise the graph's peak: ``e`` gets its own."""

    def f(x: T, w: T) -> T:
        d = x.sin()  # 16 KiB, dead after the first matmul
        big = (d @ w).tanh()  # 1 MiB: the peak
        m = (big @ w.t()).sigmoid()
        return torch.cat([m[1:], m[:1]]) * 2  # 16 KiB, the layout of d (m: not in place)

    x, w = torch.randn(64, 64), torch.randn(64, 4096)
    _, sched = _compile(f, x, w, tol=1e-3)
    d = _stored(sched)[0]
    assert d not in sched.reuse.values(), str(sched)


def test_a_stage_re_read_later_in_its_kernel_is_written_in_place_for_cpp_only() -> None:
    """A residual sum stored by a layer norm's kernel and read again by its later stages may
    go over a dying summand in C++ (it reads its own store back), not for the Triton
    printer, which recomputes it there from the summands."""
    from ember.inductor.lowering import lower_graph
    from ember.inductor.scheduler import schedule

    def f(x: T, w: T, w2: T) -> T:
        h = x + (x @ w) + (x @ w2)  # stored: three buffers, two readers
        return F.layer_norm(h, (32,)) @ w + h

    x, w, w2 = torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32)
    _, sched = _compile(f, x, w, w2, tol=1e-4)
    h = _stored(sched)[0]
    assert h in sched.inplace, str(sched)
    gm = make_fx(f, decomposition_table=decompositions())(x, w, w2)
    triton = schedule(lower_graph(gm, [x, w, w2], printer="triton"), printer="triton")
    assert _stored(triton)[0] == h and h not in triton.inplace, str(triton)


def _mlp_backward(g: T, w1: T, w2: T, gate: T, up: T, n: T) -> tuple[T, ...]:
    """The shape of a SwiGLU MLP's backward: the activation's gradient ``ga`` feeds the up
    projection's gradient, a stage over other columns (a norm's input, recomputed), then
    the gate's gradient, with matmuls between in graph order."""
    ga = g @ w1
    sig = gate.sigmoid()
    grad_up = ga * gate * sig
    normed = n * 2
    a, b = grad_up @ w2, grad_up.t() @ normed
    grad_gate = ga * up * sig * (1 + gate * (1 - sig))
    return a, b, grad_gate @ w2, grad_gate.t() @ normed


def test_a_sibling_joins_the_earlier_kernel_reading_its_inputs_and_writes_over_them() -> None:
    g, w1, w2 = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 16)
    gate, up, n = torch.randn(8, 32), torch.randn(8, 32), torch.randn(8, 16)
    _, sched = _compile(_mlp_backward, g, w1, w2, gate, up, n, tol=1e-4)
    kernels = [s for s in sched.steps if isinstance(s, Kernel)]
    assert len(kernels) == 1  # the gate's gradient joined the up projection's kernel
    (kernel,) = kernels
    inner = [st.inner for st in kernel.stages]
    assert inner == [(32,), (16,), (32,)]  # three stages, the middle one over other columns
    ga = _externs(sched)[0]
    gate_grad = kernel.stages[-1].stores[-1].name
    # the activation's gradient, read by the first stage and the last, is overwritten there
    assert sched.inplace.get(gate_grad) == ga


def test_a_sibling_stays_after_an_extern_that_mutates() -> None:
    def fn(x: T, w: T, z: T) -> tuple[T, T]:
        d = x @ w
        a = d * z
        z.add_(1)  # between the two readers of z: the second must see the new z
        return a, d * z

    x, w, z = torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)
    gm = make_fx(fn)(x, w, z.clone())
    compiled = compile_graph(gm, [x, w, z.clone()], {"graph_cache": False})
    z1, z2 = z.clone(), z.clone()
    torch.testing.assert_close(compiled(x, w, z1), fn(x, w, z2))


def test_scatters_sharing_one_zeros_each_write_into_a_fill_of_their_own() -> None:
    def f(i: T, j: T, g: T, h: T) -> tuple[T, T]:
        z = torch.zeros(6, 2)  # one zeros for two embedding backwards (T5's shared table)
        return z.index_put((i,), g, True), z.index_put((j,), h * 2, True)

    i, j = torch.tensor([0, 2, 2]), torch.tensor([5, 1, 0])
    g, h = torch.randn(3, 2), torch.randn(3, 2)
    _, sched = _compile(f, i, j, g, h)
    scatters = [s for s in sched.steps if isinstance(s, Extern) and "index_put" in str(s.target)]
    assert len(scatters) == 2
    for s in scatters:  # each writes into its own zeros: no copy, no zeros kept for the other
        assert s.names[0] in sched.inplace, str(sched)
    assert len({sched.inplace[s.names[0]] for s in scatters}) == 2


def test_a_short_heavy_value_of_one_buffer_is_recomputed_not_stored_across_a_matmul() -> None:
    def f(x: T, y: T, w: T) -> tuple[T, T]:
        s = x * x.sigmoid()  # SwiGLU's silu(gate): read before and after the matmul
        a = (s * y) @ w
        return a, s * a

    x, y, w = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 16)
    _, sched = _compile(f, x, y, w, tol=1e-5)
    assert len(_stored(sched)) == 2, str(sched)  # s * y and s * a; s itself is not stored


def test_an_attention_mask_is_made_anew_before_each_attention_call() -> None:
    def f(q: T, k: T, v: T, lengths: T) -> T:
        s = q.shape[2]
        i, j = torch.arange(s).view(1, 1, s, 1), torch.arange(s).view(1, 1, 1, s)
        mask = torch.where((j <= i) & (j < lengths.view(-1, 1, 1, 1)), 0.0, float("-inf"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(a * 2, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 2, 8, 4) for _ in range(3))
    _, sched = _compile(f, q, k, v, torch.tensor([5, 8]), tol=1e-5)
    kinds = [
        "attention" if isinstance(s, Extern) else "mask"
        for s in sched.steps
        if isinstance(s, Extern) or any(e.op is Op.WHERE for e in _bodies(s))
    ]
    # each layer's mask just before its attention: the first is dead during the second
    assert kinds == ["mask", "attention", "mask", "attention"], str(sched)


def _bodies(kernel: Kernel | Extern) -> list[Any]:
    if not isinstance(kernel, Kernel):
        return []
    return [e for st in kernel.stages for s in st.stores for e in walk(s.body)]


def test_the_memory_timeline_counts_an_output_written_in_place_once() -> None:
    from ember.inductor.memplan import _Timeline

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    _, sched = _compile(lambda x, w: (x @ w).relu() * 2, x, w)
    (mm,) = _externs(sched)
    (out,) = _stored(sched)
    assert sched.inplace == {out: mm}
    last_use = {mm: 1, out: 1}
    counted = _Timeline.of(sched, last_use, {out}, frozenset())
    assert counted.live == [512, 1024]  # the kernel's step: the product and its output
    counted.in_place(sched, {})
    assert counted.live == [512, 512] and counted.peak == 512  # one buffer: written in place
