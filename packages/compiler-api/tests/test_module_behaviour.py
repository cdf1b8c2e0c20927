"""A compiled module behaves as a module, as ``torch.compile``'s ``OptimizedModule`` does.

``state_dict`` keys start with ``_orig_mod.``; ``.to()``, ``.train()``/``.eval()`` reach the
original and return the wrapper (and a graph that read ``training`` is guarded on it); hooks
registered on the wrapper and on the original both run; attributes the wrapper lacks are the
original's; ``pickle``, ``torch.save`` and ``copy.deepcopy`` keep the original module and the
``compile`` arguments, and load a compiled module again.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import ember.compiler
from ember.compiler import OptimizedModule
from ember.compiler.backends import unregister_backend
from ember.compiler.testing import CompileCounter

X = torch.randn(5, 3)


class Net(torch.nn.Module):
    """Reads ``training`` (dropout, batch norm) and has a submodule and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(self.lin(x))) * 2


class Breaks(torch.nn.Module):
    def forward(self, x):
        return _opaque(x.sin()) + 1


@ember.compiler.disable
def _opaque(x):
    return x * 3


class Counting:
    """A picklable backend (a module-level class) that counts what it compiles."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def eager_backend(gm, example_inputs):
    return gm.forward


def recording_backend(gm, example_inputs, options=None):
    """Records the options it was compiled with, on the graph's first call."""
    recording_backend.seen.append(dict(options or {}))
    return gm.forward


recording_backend.seen = []
recording_backend.known_options = ("level", "callback")


def _times_ten(module, args, out):
    return out * 10


def _plus_one(module, args):
    return (args[0] + 1,)


def _net(seed=0):
    torch.manual_seed(seed)
    return Net()


def _reloaded(opt, how):
    """``opt`` saved and loaded back by ``pickle`` or ``torch.save``."""
    if how == "pickle":
        return pickle.loads(pickle.dumps(opt))
    buffer = io.BytesIO()
    torch.save(opt, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


# -- the same observations as torch.compile --------------------------------------------------


def _observe(make):
    """What a user sees of a compiled module: names, repr, hook order, return values."""
    model, log = _net(), []
    opt = make(model)
    opt.register_forward_pre_hook(lambda m, a: log.append(("wrapper pre", type(m).__name__)))
    opt.register_forward_hook(lambda m, a, out: log.append(("wrapper post", type(m).__name__)))
    model.register_forward_pre_hook(lambda m, a: log.append(("original pre", type(m).__name__)))
    model.register_forward_hook(lambda m, a, out: log.append(("original post", type(m).__name__)))
    opt.eval()
    opt(X)
    return {
        "state_dict": list(opt.state_dict()),
        "parameters": [name for name, _ in opt.named_parameters()],
        "modules": [name for name, _ in opt.named_modules()],
        "repr": repr(opt),
        "hooks": log,
        "returns self": (opt.to(torch.float32) is opt, opt.train() is opt, opt.eval() is opt),
        "training": (opt.training, model.training, model.lin.training),
        "submodule": opt.get_submodule("lin") is model.lin,
        "attribute": opt.lin is model.lin and opt._orig_mod is model,
    }


def test_what_a_user_observes_is_what_torch_compile_shows():
    ours = _observe(lambda m: ember.compiler.compile(m, backend="eager"))
    theirs = _observe(lambda m: torch.compile(m, backend="eager"))
    assert ours == theirs
    assert ours["state_dict"][0] == "_orig_mod.lin.weight"
    assert ours["hooks"] == [
        ("wrapper pre", "OptimizedModule"),
        ("original pre", "Net"),
        ("original post", "Net"),
        ("wrapper post", "OptimizedModule"),
    ]


def test_repr_shows_the_original_as_the_child_it_is():
    opt = ember.compiler.compile(torch.nn.Linear(2, 3), backend="eager")
    assert repr(opt) == (
        "OptimizedModule(\n  (_orig_mod): Linear(in_features=2, out_features=3, bias=True)\n)"
    )


# -- state_dict and load_state_dict ----------------------------------------------------------


def test_state_dict_round_trips_between_compiled_modules():
    source = ember.compiler.compile(_net(1), backend="eager").eval()
    target = ember.compiler.compile(_net(2), backend="eager").eval()
    target(X)  # compiled before the load: the load changes values, not the guarded tensors
    saved = io.BytesIO()
    torch.save(source.state_dict(), saved)  # plain tensors: loadable with weights_only
    saved.seek(0)
    result = target.load_state_dict(torch.load(saved, weights_only=True))
    assert result.missing_keys == [] and result.unexpected_keys == []
    torch.testing.assert_close(target(X), source._orig_mod(X))
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, msg=key)
    assert target.stats.graphs == 1


def test_load_state_dict_updates_weights_in_place_without_a_recompile():
    counter = CompileCounter()
    model = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(model, backend=counter)
    opt(X)
    new = {k: torch.randn_like(v) for k, v in opt.state_dict().items()}
    opt.load_state_dict(new)
    torch.testing.assert_close(opt(X), X @ new["_orig_mod.weight"].T + new["_orig_mod.bias"])
    assert counter.frame_count == 1  # the same parameters, new values


def test_unprefixed_keys_are_refused_as_torch_refuses_them():
    plain = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(torch.nn.Linear(3, 4), backend="eager")
    with pytest.raises(RuntimeError, match=r"Missing key.*_orig_mod\.weight") as ours:
        opt.load_state_dict(plain.state_dict())
    with pytest.raises(RuntimeError) as theirs:
        torch.compile(torch.nn.Linear(3, 4), backend="eager").load_state_dict(plain.state_dict())
    assert str(ours.value) == str(theirs.value)
    opt._orig_mod.load_state_dict(plain.state_dict())  # the original takes its own keys
    torch.testing.assert_close(opt(X), plain(X))
    assert opt.load_state_dict(plain.state_dict(), strict=False).missing_keys == [
        "_orig_mod.weight",
        "_orig_mod.bias",
    ]


def test_a_compiled_child_is_prefixed_inside_its_parent_as_in_torch():
    def parent(compile):
        torch.manual_seed(0)
        return torch.nn.Sequential(compile(torch.nn.Linear(3, 3)), torch.nn.ReLU())

    ours = parent(lambda m: ember.compiler.compile(m, backend="eager"))
    theirs = parent(lambda m: torch.compile(m, backend="eager"))
    assert (
        list(ours.state_dict())
        == list(theirs.state_dict())
        == ["0._orig_mod.weight", "0._orig_mod.bias"]
    )
    ours.eval()
    assert not ours[0].training and not ours[0]._orig_mod.training
    torch.testing.assert_close(ours(X), theirs(X))


# -- .to(), train() / eval() -----------------------------------------------------------------


def test_to_moves_the_original_returns_the_wrapper_and_guards_the_dtype():
    counter = CompileCounter()
    model = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(model, backend=counter)
    opt(X)
    assert opt.to(torch.float64) is opt and model.weight.dtype == torch.float64
    torch.testing.assert_close(opt(X.double()), model(X.double()))
    assert counter.frame_count == 2  # a float64 graph
    assert opt.float() is opt and model.weight.dtype == torch.float32
    torch.testing.assert_close(opt(X), model(X))
    assert counter.frame_count == 2  # the float32 graph serves again
    assert opt.requires_grad_(False) is opt and not model.weight.requires_grad
    assert opt.to("cpu") is opt and opt.cpu() is opt and opt.double() is opt


def test_train_and_eval_reach_every_submodule_and_recompile_once_each():
    counter = CompileCounter()
    model = _net()
    opt = ember.compiler.compile(model, backend=counter)
    opt(X)
    assert opt.eval() is opt
    assert [m.training for m in model.modules()] == [False] * 4 and not opt.training
    reference = copy.deepcopy(model)
    torch.testing.assert_close(opt(X), reference(X))  # eval: no dropout, running statistics
    assert counter.frame_count == 2
    opt.train()
    assert all(m.training for m in model.modules()) and opt.training
    opt(X)
    assert counter.frame_count == 2  # the training graph serves again
    opt.training = False  # an assignment goes to the original too, as in torch
    assert not model.training and model.lin.training
    model.train()  # the original's own flag, read back through the wrapper
    assert opt.training


def test_eval_set_on_the_original_directly_is_seen_by_the_wrapper_and_its_guards():
    counter = CompileCounter()
    model = torch.nn.Dropout(0.5)
    opt = ember.compiler.compile(model, backend=counter)
    opt(X)
    model.eval()
    assert not opt.training
    torch.testing.assert_close(opt(X), X)
    outer = ember.compiler.compile(lambda x: x * 2 if opt.training else x, backend="eager")
    torch.testing.assert_close(outer(X), X)
    model.train()
    torch.testing.assert_close(outer(X), X * 2)
    assert counter.frame_count == 2 and outer.stats.graphs == 2


# -- hooks -----------------------------------------------------------------------------------


def test_hooks_on_the_wrapper_and_on_the_original_both_change_the_output():
    model = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(model, backend="eager")
    outer = opt.register_forward_hook(_times_ten)
    inner = model.register_forward_pre_hook(_plus_one)
    torch.testing.assert_close(opt(X), model(X) * 10)  # model(X) runs the pre-hook too
    torch.testing.assert_close(opt(X), (X + 1) @ model.weight.T * 10 + model.bias * 10)
    assert list(model._forward_hooks) == [] and len(opt._forward_hooks) == 1
    outer.remove()
    torch.testing.assert_close(opt(X), model(X))
    inner.remove()
    torch.testing.assert_close(opt(X), X @ model.weight.T + model.bias)
    assert opt.stats.failures == []


def test_a_wrapper_pre_hook_with_kwargs_sees_the_wrapper_and_rewrites_the_call():
    seen = []

    def pre(module, args, kwargs):
        seen.append(module)
        return (args[0] * 0,), kwargs

    model = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(model, backend="eager")
    opt.register_forward_pre_hook(pre, with_kwargs=True)
    torch.testing.assert_close(opt(X), model.bias.expand(5, 4))
    assert seen == [opt]


def _backward_hooks(make):
    torch.manual_seed(0)
    model, log = torch.nn.Linear(3, 2), []
    opt = make(model)

    def doubled(module, grad_in, grad_out):
        log.append(("wrapper", type(module).__name__))
        return (grad_in[0] * 2,)

    opt.register_full_backward_hook(doubled)
    model.register_full_backward_pre_hook(lambda m, g: log.append(("original", type(m).__name__)))
    x = X.clone().requires_grad_()
    opt(x).sum().backward()
    return log, x.grad, model.weight.grad


def test_backward_hooks_on_the_wrapper_and_the_original_run_as_under_torch_compile():
    ours = _backward_hooks(lambda m: ember.compiler.compile(m, backend="eager"))
    theirs = _backward_hooks(lambda m: torch.compile(m, backend="eager"))
    assert ours[0] == theirs[0] and ("original", "Linear") in ours[0]
    torch.testing.assert_close(ours[1:], theirs[1:])


# -- attributes ------------------------------------------------------------------------------


def test_attributes_are_read_written_and_deleted_on_the_original():
    model = _net()
    opt = ember.compiler.compile(model, backend="eager")
    assert opt._orig_mod is model and opt.lin is model.lin
    opt.scale = 3
    assert model.scale == 3 and "scale" not in opt.__dict__ and opt.scale == 3
    del opt.scale
    assert not hasattr(model, "scale") and not hasattr(opt, "scale")
    opt.extra = torch.nn.Parameter(torch.ones(2))  # registered on the original, as in torch
    assert "extra" in dict(model.named_parameters())
    assert "_orig_mod.extra" in opt.state_dict()
    with pytest.raises(AttributeError, match="'Net' object has no attribute 'missing'"):
        opt.missing  # noqa: B018
    assert "lin" in dir(opt) and "stats" in dir(opt)


def test_len_is_the_original_s_or_a_type_error():
    pair = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    assert len(ember.compiler.compile(pair, backend="eager")) == 2
    with pytest.raises(TypeError, match="Linear does not support len"):
        len(ember.compiler.compile(torch.nn.Linear(2, 2), backend="eager"))


def test_a_lazy_module_initialises_on_its_first_compiled_call():
    model = torch.nn.LazyLinear(4)
    opt = ember.compiler.compile(model, backend="eager")
    out = opt(X)
    assert model.weight.shape == (4, 3)
    torch.testing.assert_close(out, model(X))
    assert list(opt.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]


# -- pickle, torch.save, deepcopy ------------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_saved_compiled_module_loads_compiled_with_the_same_results(how):
    model = _net()
    model.register_forward_hook(_times_ten)  # the original's hooks travel with it
    opt = ember.compiler.compile(model, backend="eager")
    opt.register_forward_pre_hook(_plus_one)  # and so do the wrapper's
    opt.eval()
    want = opt(X)
    loaded = _reloaded(opt, how)
    assert isinstance(loaded, OptimizedModule) and loaded._orig_mod is not model
    assert not loaded.training and not loaded._orig_mod.lin.training
    assert loaded.stats.graphs == 0  # compiled code is never saved
    torch.testing.assert_close(loaded(X), want)
    torch.testing.assert_close(loaded(X), model(X + 1))  # both hooks ran
    assert loaded.stats.graphs == 1 and loaded.stats.failures == []
    loaded(X)
    assert loaded.stats.graphs == 1
    for key, value in opt.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, msg=key)


def test_a_whole_compiled_module_is_not_weights_only_loadable_as_no_module_is():
    buffer = io.BytesIO()
    torch.save(ember.compiler.compile(torch.nn.Linear(2, 2), backend="eager"), buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        torch.load(buffer, weights_only=True)


def test_a_loaded_module_keeps_fullgraph():
    opt = ember.compiler.compile(Breaks(), backend="eager", fullgraph=True)
    loaded = pickle.loads(pickle.dumps(opt))
    with pytest.raises(ember.compiler.FullGraphError, match="could not capture"):
        loaded(X)
    relaxed = pickle.loads(pickle.dumps(ember.compiler.compile(Breaks(), backend="eager")))
    torch.testing.assert_close(relaxed(X), X.sin() * 3 + 1)


def test_a_loaded_module_keeps_dynamic():
    counter = Counting()
    loaded = pickle.loads(pickle.dumps(ember.compiler.compile(Net().eval(), backend=counter,
                                                              dynamic=False)))  # fmt: skip
    for n in (2, 3, 4):
        loaded(torch.randn(n, 3))
    assert loaded._settings.backend.count == 3 and counter.count == 0  # a graph per size
    dynamic = pickle.loads(pickle.dumps(ember.compiler.compile(Net().eval(), backend=Counting(),
                                                               dynamic=True)))  # fmt: skip
    for n in (2, 3, 4):
        dynamic(torch.randn(n, 3))
    assert dynamic._settings.backend.count == 1


def test_a_loaded_module_passes_its_options_and_mode_to_the_backend_again():
    recording_backend.seen.clear()
    opt = ember.compiler.compile(
        torch.nn.Linear(3, 4), backend=recording_backend, mode="max-autotune",
        options={"level": 2},
    )  # fmt: skip
    opt(X)
    loaded = pickle.loads(pickle.dumps(opt))
    torch.testing.assert_close(loaded(X), opt(X))
    assert recording_backend.seen == [{"level": 2, "mode": "max-autotune"}] * 2


def test_a_picklable_backend_object_is_saved_with_the_module():
    counter = Counting()
    opt = ember.compiler.compile(torch.nn.Linear(3, 4), backend=counter)
    opt(X)
    loaded = pickle.loads(pickle.dumps(opt))
    loaded(X)
    assert counter.count == 1  # the original's
    assert loaded._settings.backend is not counter and loaded._settings.backend.count == 2


@pytest.mark.parametrize("backend", [lambda gm, inputs: gm.forward, None])
def test_an_unpicklable_backend_is_a_clear_error(backend):
    if backend is None:

        def backend(gm, inputs):  # a local function: pickle cannot find it by name
            return gm.forward

    opt = ember.compiler.compile(torch.nn.Linear(3, 4), backend=backend)
    for save in (pickle.dumps, lambda o: torch.save(o, io.BytesIO())):
        with pytest.raises(pickle.PicklingError, match=r"its backend .* cannot be pickled") as e:
            save(opt)
        assert "save the original module (`._orig_mod`)" in str(e.value)
    pickle.loads(pickle.dumps(opt._orig_mod))  # the way out the message names works


def test_unpicklable_options_are_a_clear_error():
    opt = ember.compiler.compile(
        torch.nn.Linear(3, 4), backend=recording_backend, options={"callback": lambda: 0}
    )
    with pytest.raises(pickle.PicklingError, match=r"its options .* cannot be pickled"):
        pickle.dumps(opt)


def test_loading_with_a_backend_name_no_longer_registered_is_a_clear_error():
    ember.compiler.register_backend(eager_backend, name="test_module_behaviour_gone")
    try:
        saved = pickle.dumps(
            ember.compiler.compile(torch.nn.Linear(3, 4), backend="test_module_behaviour_gone")
        )
    finally:
        unregister_backend("test_module_behaviour_gone")
    with pytest.raises(ValueError, match="unknown backend 'test_module_behaviour_gone'"):
        pickle.loads(saved)


def test_deepcopy_is_an_independent_compiled_module():
    model = _net()
    opt = ember.compiler.compile(model, backend=lambda gm, inputs: gm.forward)  # not picklable
    opt.register_forward_hook(lambda m, a, out: out + 100)  # nor is this hook: copied anyway
    opt.eval()
    twin = copy.deepcopy(opt)
    assert isinstance(twin, OptimizedModule) and twin._orig_mod is not model
    assert twin._orig_mod.lin.weight is not model.lin.weight and not twin.training
    torch.testing.assert_close(twin(X), opt(X))
    with torch.no_grad():
        twin.lin.weight.add_(1)
    assert not torch.allclose(twin(X), opt(X))
    torch.testing.assert_close(opt(X), model(X) + 100)
    assert twin.stats.graphs == 1 and opt.stats.graphs == 1


def test_copy_wraps_the_same_original_again():
    model = torch.nn.Linear(3, 4)
    opt = ember.compiler.compile(model, backend="eager")
    opt.register_forward_hook(_times_ten)
    twin = copy.copy(opt)
    assert twin is not opt and twin._orig_mod is model
    torch.testing.assert_close(twin(X), model(X) * 10)


LOAD_ELSEWHERE = textwrap.dedent(
    """
    import sys, torch
    opt = torch.load(sys.argv[1], weights_only=False)
    x = torch.load(sys.argv[2], weights_only=True)
    out = opt(x)
    print(type(opt).__name__, opt.training, opt.stats.graphs, out.tolist())
    """
)


def test_a_compiled_module_saved_here_runs_compiled_in_a_fresh_process(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5)).eval()
    torch.save(ember.compiler.compile(model, backend="eager"), tmp_path / "opt.pt")
    torch.save(X, tmp_path / "x.pt")
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ELSEWHERE, str(tmp_path / "opt.pt"), str(tmp_path / "x.pt")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    name, training, graphs, out = done.stdout.strip().splitlines()[-1].split(" ", 3)
    assert (name, training, graphs) == ("OptimizedModule", "False", "1")
    torch.testing.assert_close(torch.tensor(json.loads(out)), model(X))
