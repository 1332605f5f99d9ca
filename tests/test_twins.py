"""A mechanism and its memory-less twin start from the same weights, bit for bit.

Every parameter is drawn by its name under the seed (``nn.keyed_normal_``), so a twin
built under the same seed holds exactly the mechanism's weights for every name it shares,
and where the memory's output starts at zero (BCMT's W_p, ARMT's W_V, MoC's W_O) the fresh
mechanism computes exactly its twin's logits. No test here copies weights across.
"""

import dataclasses

import pytest
import torch

from blockmem_lite import registry
from blockmem_lite.config import preset
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything

T = 32
TWINNED = [name for name in registry.names() if registry.lab_spec(name).twin is not None]


def _built(cfg, seed: int = 0):
    seed_everything(seed)
    return build_model(cfg).double().eval()


def _tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, T), generator=torch.Generator().manual_seed(1))


def _mechanism_and_twin(name: str):
    cfg = preset("tiny", arch=name, seq_len=T).model
    return cfg, registry.lab_spec(name).twin(cfg)


def _shared_parameters_equal(model, twin) -> list[str]:
    """The twin's parameters that differ from the model's of the same name (none expected)."""
    own = dict(model.named_parameters())
    return [name for name, p in twin.named_parameters()
            if name not in own or not torch.equal(p, own[name])]


def test_the_kit_has_twins_to_check():
    assert {"bcmt", "cat", "armt"} <= set(TWINNED)


@pytest.mark.parametrize("name", TWINNED)
def test_a_twin_holds_the_mechanisms_weights(name):
    cfg, twin_cfg = _mechanism_and_twin(name)
    model, twin = _built(cfg), _built(twin_cfg)
    assert _shared_parameters_equal(model, twin) == []
    assert sum(p.numel() for p in twin.parameters()) > 0


@pytest.mark.parametrize("name", TWINNED)
def test_another_seed_gives_other_weights(name):
    """Teeth: the draw follows the seed, so a twin of another seed differs everywhere."""
    cfg, twin_cfg = _mechanism_and_twin(name)
    model, twin = _built(cfg), _built(twin_cfg, seed=1)
    differing = _shared_parameters_equal(model, twin)
    matrices = [n for n, p in twin.named_parameters() if p.dim() >= 2 and p.abs().sum() > 0]
    assert set(matrices) <= set(differing)


@pytest.mark.parametrize("name, twin_arch", [("bcmt", None), ("bcmt", "honly"),
                                              ("armt", None), ("moc", "dense")])
def test_a_fresh_mechanism_computes_its_twins_logits(name, twin_arch):
    """The memory's output starts at zero, so at step 0 it adds exactly nothing."""
    if twin_arch is None:
        cfg, twin_cfg = _mechanism_and_twin(name)
    else:
        cfg = preset("tiny", arch=name, seq_len=T).model
        twin_cfg = dataclasses.replace(cfg, arch=twin_arch)   # the same sizes, no memory
    model, twin = _built(cfg), _built(twin_cfg)
    x = _tokens(cfg.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(x).logits, twin(x).logits)


def test_cat_with_its_memory_off_computes_its_twins_logits():
    """CAT's memory is on from the start (its chunk vectors); switched off, it is the twin."""
    cfg, twin_cfg = _mechanism_and_twin("cat")
    model, twin = _built(cfg), _built(twin_cfg)
    x = _tokens(cfg.vocab_size)
    with torch.no_grad():
        on = model(x).logits
        model.cfg = dataclasses.replace(model.cfg, memory=False)
        assert torch.equal(model(x).logits, twin(x).logits)
        assert not torch.equal(on, twin(x).logits)


def test_building_leaves_the_global_random_state_alone():
    """Twins built under one seed also draw the same dropout and sampling afterwards."""
    seed_everything(0)
    build_model(preset("tiny", arch="bcmt").model)
    after_bcmt = torch.rand(3)
    seed_everything(0)
    build_model(preset("tiny", arch="honly").model)
    assert torch.equal(torch.rand(3), after_bcmt)
