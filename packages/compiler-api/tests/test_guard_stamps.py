"""Guard stamps through the whole pipeline: once a compiled model's check runs on its stamp
program, every change a user can make to the model still gives eager's answer (a recompile
where eager's code path changes, the cached graph where nothing it read changed)."""

from __future__ import annotations

import pytest
import torch

import ember.compiler
from ember.capture.frame_compiler import code_cache
from ember.guards import _native, settings


class Config:
    """A transformers-style config: names mapped, then read past its own __getattribute__."""

    attribute_map = {"width": "hidden_size"}

    def __init__(self) -> None:
        self.hidden_size = 8
        self.use_gate = True
        self.act = "gelu"

    def __getattribute__(self, key: str) -> object:
        if key != "attribute_map" and key in object.__getattribute__(self, "attribute_map"):
            key = object.__getattribute__(self, "attribute_map")[key]
        return object.__getattribute__(self, key)


class Layer(torch.nn.Module):
    shift = 0.5  # a class attribute the forward reads

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.lin = torch.nn.Linear(config.width, config.width)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.scale + self.shift
        if self.config.use_gate:
            y = y * torch.sigmoid(x)
        act = torch.nn.functional.gelu if self.config.act == "gelu" else torch.relu
        return act(y)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.layers = torch.nn.ModuleList(Layer(self.config) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        if getattr(self.config, "final_norm", False):
            x = torch.nn.functional.layer_norm(x, x.shape[-1:])
        return x


def _warm(compiled, x):  # type: ignore[no-untyped-def]
    for _ in range(4):  # the second full pass records the program, the third runs on it
        compiled(x)
    [entry] = code_cache(Model.forward.__code__).entries
    return entry.guards.stamps


CHANGES = {
    "config flag": lambda m: setattr(m.config, "use_gate", False),
    "config string": lambda m: setattr(m.config, "act", "relu"),
    "config attribute appears": lambda m: setattr(m.config, "final_norm", True),
    "instance float": lambda m: setattr(m.layers[1], "scale", 3.0),
    "class attribute": lambda m: setattr(Layer, "shift", 1.5),
    "forward hook": lambda m: m.layers[2].register_forward_hook(lambda mod, a, out: out * 0),
    "submodule swapped for another class": lambda m: setattr(
        m.layers[0], "lin", torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    ),
    "layer appended": lambda m: m.layers.append(Layer(m.config)),
    "eval mode": lambda m: m.layers[0].lin.eval(),
    "weight replaced in place": lambda m: m.layers[0].lin.weight.data.mul_(2),
    "nothing the model reads": lambda m: setattr(m, "note", "unrelated"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_stamps_gives_eagers_answer(change: str) -> None:
    ember.compiler.reset()
    saved_shift = Layer.shift
    try:
        model, x = Model(), torch.randn(4, 8)
        compiled = ember.compiler.compile(model, backend="eager")
        stamps = _warm(compiled, x)
        assert stamps is not None and stamps.stamped and not stamps.off
        graphs = compiled.stats.graphs
        CHANGES[change](model)
        with torch.no_grad():
            want = model(x)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), want)
        if change in ("weight replaced in place", "nothing the model reads"):
            assert compiled.stats.graphs == graphs
        else:
            assert compiled.stats.graphs > graphs, "eager's path changed: a recompile is due"
    finally:
        Layer.shift = saved_shift


def test_config_reads_are_guarded_past_the_configs_getattribute() -> None:
    ember.compiler.reset()
    model, x = Model(), torch.randn(4, 8)
    compiled = ember.compiler.compile(model, backend="eager")
    stamps = _warm(compiled, x)
    names = {str(g.source) for g in stamps.stamped}
    assert any("object.__getattribute__(" in n and "'use_gate')" in n for n in names), names
    assert _native.stamps_hits(stamps.slot[0]) >= 1


def test_stamps_off_gives_the_same_answers() -> None:
    ember.compiler.reset()
    model, x = Model(), torch.randn(4, 8)
    with settings.section.patch(stamps=False):
        compiled = ember.compiler.compile(model, backend="eager")
        for _ in range(3):
            compiled(x)
    [entry] = code_cache(Model.forward.__code__).entries
    assert entry.guards.stamps is None
    model.config.use_gate = False
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_transformers_config_change_after_stamps(name: str) -> None:
    """A real model's check runs on its program; a config flag set later is still seen."""
    models = pytest.importorskip("models.hf", reason="benchmarks/ is on the path in the repo")
    if models.missing() is not None:
        pytest.skip(models.missing())
    ember.compiler.reset()
    model, inputs = models.HF_MODELS[name].make(quick=True)
    model.eval()
    compiled = ember.compiler.compile(model, backend="eager")
    with torch.no_grad():
        for _ in range(4):
            compiled(**inputs)
        [entry] = code_cache(type(model).forward.__code__).entries
        stamps = entry.guards.stamps
        assert stamps is not None and len(stamps.stamped) > 100 and not stamps.off
        hits = _native.stamps_hits(stamps.slot[0])
        compiled(**inputs)
        assert _native.stamps_hits(stamps.slot[0]) == hits + 1
        model.config.output_hidden_states = True
        want = model(**inputs)
        got = compiled(**inputs)
    assert got["hidden_states"] is not None
    assert len(got["hidden_states"]) == len(want["hidden_states"])
    for a, b in zip(got["hidden_states"], want["hidden_states"], strict=True):
        torch.testing.assert_close(a, b)
    assert compiled.stats.graphs == 2
