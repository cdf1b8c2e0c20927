"""ember.compiler.config: one source for every setting; precedence; options; limits;
suppress_errors and verbose; the user's cflags; modes (issue 17 section 1)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ember.compiler
import ember.guards
from ember.capture import frame_compiler
from ember.compiler import config
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    ember.compiler.reset()
    yield
    for section in config.sections.values():
        section.unset(*section.fields)
    ember.compiler.reset()


def scale(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def shapes(compiled: Any, n: int) -> None:
    for size in range(1, n + 1):
        x = torch.randn(size)
        assert_same(compiled(x), scale(x))


# ---- precedence: default < environment < set < patch < compile(options) -------------------


def test_environment_sets_defaults_and_each_layer_overrides_the_one_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert config.guards.cache_size_limit == 8
    monkeypatch.setenv("EMBER_CACHE_SIZE_LIMIT", "5")
    assert config.guards.cache_size_limit == 5
    config.guards.cache_size_limit = 4
    assert config.guards.cache_size_limit == 4
    with config.patch({"guards.cache_size_limit": 3}):
        assert config.guards.cache_size_limit == 3
        with config.patch(cache_size_limit=2):  # a bare name only one section has
            assert config.guards.cache_size_limit == 2
        assert config.guards.cache_size_limit == 3
    assert config.guards.cache_size_limit == 4
    config.guards.unset("cache_size_limit")
    assert config.guards.cache_size_limit == 5
    assert config.list_options()["guards.cache_size_limit"] == 5


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_SIZE_LIMIT", "many")
    with pytest.raises(ValueError, match=r"EMBER_CACHE_SIZE_LIMIT='many'"):
        _ = config.guards.cache_size_limit


def test_every_env_var_is_read_by_its_package_settings_only() -> None:
    root = Path(__file__).parents[2]
    readers = {
        str(path.relative_to(root))
        for path in root.glob("*/src/ember/**/*.py")
        if ("os.environ" in (text := path.read_text()) and "os.environ[" not in text)
        or "getenv" in text
    }
    readers -= {p for p in readers if "os.environ.get" not in Path(root / p).read_text()}
    # aotgraph's settings read XDG_CACHE_HOME (the user's cache root); section.py reads
    # each field's variable; nothing else reads the environment
    assert readers <= {
        "guards/src/ember/guards/settings.py",
        "aotgraph/src/ember/aotgraph/section.py",
        "aotgraph/src/ember/aotgraph/settings.py",
    }, readers


def test_errors_name_the_bad_key_and_list_the_valid_ones() -> None:
    with pytest.raises(AttributeError, match=r"no setting 'cache_limit'.*cache_size_limit"):
        config.guards.cache_limit = 3
    with pytest.raises(KeyError, match=r"no setting 'guards.limit'.*guards.cache_size_limit"):
        config.patch({"guards.limit": 1})
    with pytest.raises(TypeError, match=r"guards.cache_size_limit must be a int, not str"):
        config.patch({"guards.cache_size_limit": "3"})
    with pytest.raises(ValueError, match=r"at least 1"):
        config.guards.cache_size_limit = 0
    with pytest.raises(ValueError, match=r"has no option 'cflagz'.*guards.cache_size_limit"):
        ember.compiler.compile(scale, options={"cflagz": []})
    with pytest.raises(TypeError, match=r"'eager' takes no options.*capture.suppress_errors"):
        ember.compiler.compile(scale, backend="eager", options={"suppress": False})
    with pytest.raises(TypeError, match=r"capture.verbose must be a bool"):
        ember.compiler.compile(scale, backend="eager", options={"capture.verbose": 1})


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_module_constant_is_a_view_of_the_setting(backend: str) -> None:
    assert ember.guards.DEFAULT_CACHE_SIZE_LIMIT == 8
    ember.guards.DEFAULT_CACHE_SIZE_LIMIT = 3  # the issue: this used to still allow 8
    assert config.guards.cache_size_limit == 3 == ember.guards.CodeCache("f").limit
    compiled = ember.compiler.compile(scale, backend=backend, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ember.guards.CacheLimitWarning)
        shapes(compiled, 5)
    assert compiled.stats.graphs == 3
    with pytest.raises(ValueError, match="at least 1"):
        ember.guards.DEFAULT_CACHE_SIZE_LIMIT = 0


def test_patch_is_local_to_its_thread() -> None:
    seen: list[int] = []
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait()
        seen.append(config.guards.cache_size_limit)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with config.patch({"guards.cache_size_limit": 2}):
        inside.set()
        done.wait(10)
        assert config.guards.cache_size_limit == 2
    thread.join()
    assert seen == [8]


# ---- the cache limits take effect on every backend --------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_size_limit_set_globally_takes_effect(backend: str) -> None:
    config.guards.cache_size_limit = 3
    compiled = ember.compiler.compile(scale, backend=backend, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ember.guards.CacheLimitWarning)
        shapes(compiled, 5)
    assert compiled.stats.graphs == 3
    assert [f.category for f in compiled.stats.failures] == ["cache_limit"]
    assert "cache_size_limit (3)" in compiled.stats.failures[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_options_and_patch_set_the_limit_for_one_object(backend: str) -> None:
    def other(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + 1

    one = ember.compiler.compile(scale, backend=backend, options={"guards.cache_size_limit": 1})
    with config.patch({"guards.cache_size_limit": 2}):
        two = ember.compiler.compile(other, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ember.guards.CacheLimitWarning)
            shapes(one, 3)
            for size in (1, 2, 3):
                x = torch.randn(size)
                assert_same(two(x), other(x))
    assert (one.stats.graphs, two.stats.graphs) == (1, 2)


def test_accumulated_cache_size_limit_bounds_entries_made_over_a_life() -> None:
    def run(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x) * 2

    config.guards.accumulated_cache_size_limit = 3
    compiled = ember.compiler.compile(run, backend="eager")
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ember.guards.CacheLimitWarning)
        for _ in range(5):  # each model dies after its call: its entry goes with it
            m = torch.nn.Linear(3, 3)
            assert_same(compiled(m, x), run(m, x))
            del m
    assert compiled.stats.graphs == 3
    assert [f.category for f in compiled.stats.failures] == ["cache_limit"]


# ---- suppress_errors and verbose ---------------------------------------------------------------


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("planted bug in codegen")


@pytest.mark.parametrize("backend", BACKENDS)
def test_suppress_errors_true_falls_back_with_the_reason(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_compiler, "_replacement", broken)
    compiled = ember.compiler.compile(scale, backend=backend, dynamic=False)
    x = torch.randn(4)
    assert_same(compiled(x), scale(x))
    (failure,) = compiled.stats.failures
    assert failure.category == "internal" and "planted bug" in failure.reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_suppress_errors_false_raises_naming_the_users_frame(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_compiler, "_replacement", broken)
    compiled = ember.compiler.compile(
        scale, backend=backend, options={"capture.suppress_errors": False}
    )
    with pytest.raises(ember.compiler.InternalError, match=r"planted bug") as caught:
        compiled(torch.randn(4))
    assert "scale (" in str(caught.value) and "test_config.py" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_suppress_errors_false_raises_a_backends_error() -> None:
    def refuses(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        raise ValueError("no graphs today")

    config.capture.suppress_errors = False
    with pytest.raises(ember.compiler.InternalError, match=r"(?s)no graphs today.*test_config.py"):
        ember.compiler.compile(scale, backend=refuses)(torch.randn(3))
    config.capture.suppress_errors = True
    x = torch.randn(3)
    compiled = ember.compiler.compile(scale, backend=refuses)
    assert_same(compiled(x), scale(x))
    assert compiled.stats.failures[0].category == "backend"


@pytest.mark.parametrize("backend", BACKENDS)
def test_verbose_warns_each_fallback_with_reason_place_and_traceback(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_compiler, "_replacement", broken)
    compiled = ember.compiler.compile(scale, backend=backend, options={"capture.verbose": True})
    x = torch.randn(3)
    pattern = "(?s)scale .* runs eagerly: internal error.*test_config.py.*Traceback.*planted"
    with pytest.warns(ember.compiler.FallbackWarning, match=pattern):
        assert_same(compiled(x), scale(x))
    ember.compiler.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ember.compiler.FallbackWarning)
        quiet = ember.compiler.compile(scale, backend=backend)
        assert_same(quiet(x), scale(x))
    assert quiet.stats.failures[0].category == "internal"


# ---- inductor's settings: the user's cflags ----------------------------------------------------


def test_the_documented_cflags_example_takes_effect(tmp_path: Path) -> None:
    from ember.inductor.cache import DEFAULT_CFLAGS

    flags = [*DEFAULT_CFLAGS, "-DEMBER_USER_FLAG=1"]
    with config.patch({"inductor.trace": True, "inductor.trace_dir": str(tmp_path)}):
        compiled = ember.compiler.compile(scale, options={"cflags": flags})
        x = torch.randn(64)
        assert_same(compiled(x), scale(x))
    commands = [p.read_text() for p in tmp_path.glob("*/compile_command.txt")]
    assert commands and all("-DEMBER_USER_FLAG=1" in c for c in commands)


def test_extra_cflags_reach_the_compiler() -> None:
    x = torch.randn(16)
    bad = {"inductor.extra_cflags": ["-fno-such-ember-flag"], "inductor.graph_cache": False}
    compiled = ember.compiler.compile(scale, options=bad)
    with pytest.warns(UserWarning, match=r"C\+\+ build failed.*no-such-ember-flag"):
        assert_same(compiled(x), scale(x))  # the build fails: that graph runs eagerly


# ---- modes -------------------------------------------------------------------------------------


def test_modes_set_real_settings_for_their_compiles() -> None:
    seen: list[bool] = []

    def observing(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        seen.append(config.inductor.max_autotune)
        return gm.forward

    x = torch.randn(3)
    for mode in ("default", "max-autotune"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no effect with this backend: said once
            compiled = ember.compiler.compile(scale, backend=observing, mode=mode)
        assert_same(compiled(x), scale(x))
    assert seen == [False, True]
    assert config.inductor.max_autotune is False
    assert ember.compiler.list_mode_options("max-autotune") == {
        "inductor.max_autotune": True,
        "inductor.cudagraphs": True,
    }
    assert set(ember.compiler.list_mode_options()) == {
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    }  # fmt: skip


def test_a_mode_without_effect_says_so_once() -> None:
    from ember.compiler import wrap

    wrap._warned_modes.clear()
    with pytest.warns(UserWarning, match=r"'max-autotune' has no effect with backend 'eager'"):
        ember.compiler.compile(scale, backend="eager", mode="max-autotune")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ember.compiler.compile(scale, backend="eager", mode="max-autotune")


def test_the_docs_table_lists_every_setting_and_variable() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    for section_name, section in config.sections.items():
        for name, f in section.fields.items():
            assert f"`{section_name}.{name}`" in doc, name
            assert not f.metadata["env"] or f"`{f.metadata['env']}`" in doc, name


def column_sums(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(0) + 1  # a column kernel: its tile width is one of the choices


def test_max_autotune_times_choices_keeps_the_fastest_and_remembers_it(tmp_path: Path) -> None:
    x = torch.randn(64, 40)
    settings = {"aotgraph.cache_dir": str(tmp_path / "cache"), "inductor.trace": True}
    for run in ("timed", "remembered"):
        ember.compiler.reset()
        trace = tmp_path / run
        with config.patch(settings, trace_dir=str(trace)):
            compiled = ember.compiler.compile(
                column_sums, mode="max-autotune", options={"graph_cache": False}
            )
            assert_same(compiled(x), column_sums(x))
        (record,) = [p.read_text() for p in trace.glob("*/07_autotune.txt")]
        assert ("cached=True" in record) == (run == "remembered"), record
        assert "tile=8" in record and "tile=32" in record  # every choice was timed
    assert len(list((tmp_path / "cache" / "inductor" / "autotune").glob("*.json"))) == 1


def test_max_autotune_leaves_graphs_with_integer_inputs_untimed(tmp_path: Path) -> None:
    def gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return table[index].sum(0) * 2

    table, index = torch.randn(10, 40), torch.tensor([3, 7, 9])
    with config.patch({"inductor.trace": True, "inductor.trace_dir": str(tmp_path)}):
        compiled = ember.compiler.compile(gather, mode="max-autotune")
        assert_same(compiled(table, index), gather(table, index))
    records = [p.read_text() for p in tmp_path.glob("*/07_autotune.txt")]
    assert records and all("integer input" in r for r in records)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_reduce_overhead_says_once_why_it_does_nothing_here(backend: str) -> None:
    from ember.compiler import wrap

    wrap._warned_modes.clear()
    with pytest.warns(UserWarning, match=r"'reduce-overhead' has no effect.*CUDA graphs"):
        compiled = ember.compiler.compile(scale, backend=backend, mode="reduce-overhead")
    x = torch.randn(5)
    assert_same(compiled(x), scale(x))
    assert ember.compiler.list_mode_options("reduce-overhead") == {"inductor.cudagraphs": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ember.compiler.compile(scale, backend=backend, mode="reduce-overhead")
        with config.patch({"debug.warn_modes": False}):
            wrap._warned_modes.clear()
            ember.compiler.compile(scale, backend=backend, mode="reduce-overhead")


@pytest.mark.parametrize("backend", ["inductor", "cudagraphs"])
def test_cuda_graphs_leave_cpu_graphs_as_they_are(backend: str) -> None:
    """reduce-overhead (CUDA graphs around inductor's graphs) and the cudagraphs backend:
    graphs of CPU tensors run as before, with no warning; a training step included."""
    mode = "reduce-overhead" if backend == "inductor" else None
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = ember.compiler.compile(model, backend=backend, mode=mode)
    x = torch.randn(4, 6)
    for _ in range(3):
        assert_same(compiled(x), model(x))
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad)


def test_cudagraphs_backend_checks_its_option() -> None:
    with pytest.raises(ValueError, match="option 'copy_outputs' must be a bool, not int"):
        ember.compiler.compile(scale, backend="cudagraphs", options={"copy_outputs": 1})
    with pytest.raises(ValueError, match="copy_output"):
        ember.compiler.compile(scale, backend="cudagraphs", options={"copy_output": True})


def test_max_autotune_times_a_graph_whose_input_overlaps_itself(tmp_path: Path) -> None:
    x = torch.randn(1, 40).expand(64, 40)  # stride 0: random inputs must overlap the same way
    settings = {"aotgraph.cache_dir": str(tmp_path / "c"), "inductor.trace": True}
    with config.patch(settings, trace_dir=str(tmp_path / "t")):
        compiled = ember.compiler.compile(column_sums, mode="max-autotune")
        assert_same(compiled(x), column_sums(x))
    records = [p.read_text() for p in (tmp_path / "t").glob("*/07_autotune.txt")]
    assert records and all("why_not=''" in r and "trials=((" in r for r in records), records


def test_each_variable_sets_one_setting_but_ember_check_which_sets_each_packages() -> None:
    readers: dict[str, list[str]] = {}
    for section_name, section in config.sections.items():
        for name, f in section.fields.items():
            if f.metadata["env"]:
                readers.setdefault(f.metadata["env"], []).append(f"{section_name}.{name}")
    shared = {env: names for env, names in readers.items() if len(names) > 1}
    # capture and aotgraph install alone (neither imports the other): each reads the switch
    assert shared == {"EMBER_CHECK": ["capture.check", "aotgraph.check"]}
    with config.patch({"capture.check": False}):  # set apart, each is one setting
        assert config.capture.check is False
