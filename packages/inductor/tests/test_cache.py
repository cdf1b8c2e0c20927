"""The disk cache: a second process hits it; corrupt or foreign entries are rebuilt, not loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ember.inductor.cache import CompileOptions, build, cache_dir, cache_key

SOURCE = 'extern "C" int ember_test_answer() { return 42; }\n'

SCRIPT = textwrap.dedent("""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember.inductor import compile_graph
    x = torch.randn(8, 8)
    c = compile_graph(make_fx(lambda x: (x.sin() * 3).sum(0))(x), [x])
    torch.testing.assert_close(c(x), (x.sin() * 3).sum(0))
    print("HIT" if c.cache_hit else "MISS")
""")


@pytest.mark.slow
def test_second_process_hits_the_cache() -> None:
    env = dict(os.environ)
    runs = [
        subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert runs[1] == "HIT", runs
    assert str(cache_dir()).startswith(os.environ["EMBER_CACHE_DIR"])


def test_corrupt_entry_is_rebuilt() -> None:
    options = CompileOptions()
    path, _, _ = build(SOURCE, options)
    path.write_bytes(b"not a shared library")
    path2, _, hit2 = build(SOURCE, options)
    assert (path2, hit2) == (path, False)
    assert path2.read_bytes().startswith(b"\x7fELF")
    assert build(SOURCE, options)[2] is True


def test_a_build_that_loses_the_race_keeps_the_winners_library(monkeypatch) -> None:
    """Two builds of one source (two threads or processes): the one that found no entry
    and finishes second keeps the entry the first installed, which a build may be loading
    by then; it used to delete whatever stood there before building."""
    import ember.inductor.cache as cache

    options = CompileOptions()
    path, _, _ = build(SOURCE, options)
    inode = os.stat(path).st_ino
    looks = []
    real = cache.valid

    def valid(entry: object, key: str) -> bool:  # the loser's first look: no entry yet
        looks.append(entry)
        return len(looks) > 1 and real(entry, key)

    monkeypatch.setattr(cache, "valid", valid)
    got, _, hit = build(SOURCE, options)
    assert (got, hit, len(looks)) == (path, False, 2)
    assert os.stat(path).st_ino == inode
    assert list(path.parent.parent.glob(".trash-*")) == []


def test_foreign_entry_is_rebuilt() -> None:
    options = CompileOptions()
    path, _, _ = build(SOURCE, options)
    marker = path.parent / "ok"
    marker.write_text(json.dumps({"key": "someone else", "sha256": "0"}))
    assert build(SOURCE, options)[2] is False
    assert json.loads(marker.read_text())["key"] == cache_key(SOURCE, options)


def test_key_depends_on_flags_and_source() -> None:
    a = cache_key(SOURCE, CompileOptions())
    assert a != cache_key(SOURCE, CompileOptions(cflags=("-O1", "-fPIC", "-shared")))
    assert a != cache_key(SOURCE + "\n", CompileOptions())


def test_graph_cache_skips_lowering_and_survives_a_bad_record() -> None:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember.inductor import compile_graph
    from ember.inductor.graph_cache import _path, graph_key

    x = torch.randn(5, 6)
    gm = make_fx(lambda x: (x.cos() - 1).amax(0))(x)
    first = compile_graph(gm, [x])
    torch.testing.assert_close(first(x), (x.cos() - 1).amax(0))
    second = compile_graph(gm, [x])
    assert second.schedule is None and second.cache_hit  # from the graph cache
    torch.testing.assert_close(second(x), (x.cos() - 1).amax(0))
    record = _path(graph_key(gm, [x], CompileOptions()))
    record.write_text("{not json")
    third = compile_graph(gm, [x])
    assert third.schedule is not None
    torch.testing.assert_close(third(x), (x.cos() - 1).amax(0))


def test_graph_cache_record_is_not_shared_across_default_dtypes() -> None:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember.inductor import compile_graph

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a factory call without dtype=: its graph reads the same under any default dtype
        return (x * 2, torch.ones(5, 5) + x)

    x = torch.randn(5, 5)
    gm = make_fx(fn)(x)
    assert "dtype" not in gm.code  # the graph itself does not say which dtype ones() makes
    first = compile_graph(gm, [x])
    assert first(x)[1].dtype == torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        gm64 = make_fx(fn)(x)
        assert gm64.code == gm.code
        second = compile_graph(gm64, [x])
        assert not second.cache_hit  # a record made under float32 would write float32 bits
        got = second(x)[1]
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, fn(x)[1])
    finally:
        torch.set_default_dtype(old)
