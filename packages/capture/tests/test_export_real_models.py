"""Export of the real models (transformers, tiny random-init configs from
``benchmarks/models/hf.py``; nothing is downloaded): ``.module()`` equals eager, with the
model's own output class (a ``ModelOutput``, which transformers registers with torch's
pytree) or a tuple, and the program round-trips through ``save``/``load``.

Their forwards are wrapped by decorators (``(*args, **kwargs)`` frames), write into their
own ``**kwargs`` and set a module-level flag that they restore before returning
(transformers' output capturing): none of that is an effect anyone can observe, so none
is refused."""

from __future__ import annotations

import pytest
import torch

import ember.capture as ec

models = pytest.importorskip("models.hf", reason="benchmarks/ is on the path in the repository")
if models.missing() is not None:
    pytest.skip(models.missing(), allow_module_level=True)

NAMES = ["gpt2", "bert", "llama", "t5", "vit"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("return_dict", [True, False])
def test_real_model_exports_equal_to_eager(name, return_dict, tmp_path):
    model, inputs = models.HF_MODELS[name].make(quick=True)
    model.eval()
    kwargs = {**inputs, "return_dict": return_dict}
    with torch.no_grad():
        ep = ec.export(model, (), kwargs)
        want = model(**kwargs)
        for program in (ep, ec.load(_saved(ep, tmp_path))):
            got = program.module()(**kwargs)
            assert type(got) is type(want)
            if return_dict:
                assert list(got.keys()) == list(want.keys())
            torch.testing.assert_close(tuple(got.values()) if return_dict else got,
                                       tuple(want.values()) if return_dict else want)  # fmt: skip


def _saved(ep, tmp_path):
    path = tmp_path / "program.ember"
    ep.save(path)
    return path
