"""The previous chapters (blockmem_lite.scratch) equal the library layers they mirror, and a
planted bug goes into a model by swapping a class attribute, as the notebooks plant them."""

import pytest
import torch

from blockmem_lite import ModelConfig, build_model, scratch
from blockmem_lite.checks import CheckFailed, check_causal
from blockmem_lite.models import bcmt, cat
from blockmem_lite.nn import MLP, RMSNorm, SelfAttention, reference_attention
from blockmem_lite.ops import cat_layout


def test_split_and_merge_heads_are_inverse_and_match_the_attention_layer():
    x = torch.randn(2, 5, 12, dtype=torch.float64)                    # (B, T, D)
    heads = scratch.split_heads(x, 3)                                  # (B, H, T, hd)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])                       # head 1 = its slice
    assert torch.equal(scratch.merge_heads(heads), x)
    assert torch.equal(scratch.merge_heads(heads), SelfAttention.merge_heads(heads))


@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_reference_attention(masked):
    q, k, v = torch.randn(3, 2, 2, 6, 4, dtype=torch.float64).unbind(0)
    mask = torch.ones(6, 6, dtype=torch.bool).tril() if masked else None
    got, got_w = scratch.attention(q, k, v, mask)
    want, want_w = reference_attention(q, k, v, mask=mask)
    assert torch.allclose(got, want, atol=1e-12) and torch.allclose(got_w, want_w, atol=1e-12)


def test_rms_norm_and_swiglu_equal_the_layers():
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    norm, mlp = RMSNorm(16).double(), MLP(16).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        assert torch.allclose(scratch.rms_norm(x, norm), norm(x), atol=1e-12)
        assert torch.allclose(scratch.swiglu(x, mlp), mlp(x), atol=1e-12)


def test_gpt_logits_equal_a_dense_model():
    cfg = ModelConfig(arch="dense", d_model=16, n_layer=2, n_head=2, seq_len=24)
    model = build_model(cfg).double().eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        assert torch.allclose(scratch.gpt_logits(tokens, model), model(tokens).logits,
                              atol=1e-10)
        torch.manual_seed(1)                          # teeth: another seed, other weights
        other = build_model(cfg).double().eval()
        assert not torch.allclose(scratch.gpt_logits(tokens, other), model(tokens).logits,
                                  atol=1e-3)


def no_shift(memories):
    """The planted bug: block i reads M_i, which holds its own summary."""
    return memories


class NoShiftBCMT(bcmt.BCMTLM):
    shift = staticmethod(no_shift)


def _model_and_planted(cfg, planted_class):
    """The library's model (fp64, eval) and ``planted_class`` with the same weights."""
    torch.manual_seed(0)
    model = build_model(cfg).double().eval()
    if cfg.arch == "bcmt":                     # W_p = 0 at init: give the memory a voice
        with torch.no_grad():
            torch.nn.init.normal_(model.blocks[0].memory_proj.weight, std=0.3)
    planted = planted_class(cfg).double().eval()
    planted.load_state_dict(model.state_dict())
    return model, planted


def test_a_bcmt_subclass_with_another_shift_leaks_and_the_library_does_not():
    cfg = ModelConfig(arch="bcmt", d_model=16, n_layer=1, n_head=2, seq_len=32, block_size=8)
    model, leaky = _model_and_planted(cfg, NoShiftBCMT)
    tokens = torch.randint(0, 256, (1, 32))
    check_causal(model, tokens)
    with pytest.raises(CheckFailed, match="future"):
        check_causal(leaky, tokens)
    assert bcmt.BCMTLM.shift is bcmt.shift_one_block                  # the class is untouched


def one_slot_late(n_chunks, chunk_size, separator=False, device=None):
    """The planted bug: each token is read one slot later, at its successor's slot."""
    slots = cat_layout.token_slots(n_chunks, chunk_size, separator, device) + 1
    return slots.clamp(max=cat_layout.n_slots(n_chunks, chunk_size, separator) - 1)


class LateReadoutCAT(cat.CATLM):
    readout_slots = staticmethod(one_slot_late)


def test_a_cat_subclass_with_a_late_readout_leaks_and_the_library_does_not():
    cfg = ModelConfig(arch="cat", d_model=16, n_layer=2, n_head=2, seq_len=32, chunk_size=4)
    model, leaky = _model_and_planted(cfg, LateReadoutCAT)
    tokens = torch.randint(0, 256, (1, 24))
    check_causal(model, tokens)
    with pytest.raises(CheckFailed, match="future"):
        check_causal(leaky, tokens)
    assert cat.CATLM.readout_slots is cat_layout.readout_slots
