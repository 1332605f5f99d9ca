"""Dense baseline: attention paths agree, cache == full forward, causality, errors."""

import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.nn import attention, reference_attention
from blockmem_lite.trace import trace


def _model(**kw):
    return build_model(preset("tiny", **kw)).double().eval()


def test_sdpa_matches_reference_attention_for_all_alignments():
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    v = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    for tq in (1, 5):
        fast = attention(q[:, :, :tq], k, v, causal=True)
        ref, w = reference_attention(q[:, :, :tq], k, v, causal=True)
        assert torch.allclose(fast, ref, atol=1e-12)
        # bottom-right alignment: the last query sees every key
        assert torch.all(w[..., -1, :] > 0)
    same = attention(q, k[:, :, :5], v[:, :, :5], causal=True)
    ref_same, w_same = reference_attention(q, k[:, :, :5], v[:, :, :5], causal=True)
    assert torch.allclose(same, ref_same, atol=1e-12)
    assert torch.all(w_same[..., 0, 1:] == 0)


def test_reference_path_equals_fast_path():
    m = _model()
    x = torch.randint(0, 256, (2, 32))
    assert torch.allclose(m(x).logits, m(x, reference=True).logits, atol=1e-10)


@pytest.mark.parametrize("prompt_len", [1, 7, 31])
def test_cached_generation_reproduces_full_forward(prompt_len):
    m = _model()
    x = torch.randint(0, 256, (3, 32))
    full = m(x).logits
    logits, state = m.prefill(x[:, :prompt_len], max_len=32)
    pieces = [logits]
    for t in range(prompt_len, 32):
        step_logits, state = m.step(x[:, t], state)
        pieces.append(step_logits[:, None])
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    assert state.position == 32


def test_greedy_generate_matches_argmax_of_full_forward():
    m = _model()
    prompt = torch.randint(0, 256, (2, 6))
    out = m.generate(prompt, 10, greedy=True)
    assert out.shape == (2, 16)
    assert torch.equal(out[:, :6], prompt)
    full = m(out[:, :-1]).logits
    assert torch.equal(full[:, 5:].argmax(-1), out[:, 6:])


def test_state_bytes_grow_with_capacity():
    m = _model()
    x = torch.randint(0, 256, (1, 4))
    _, small = m.prefill(x, max_len=16)
    _, big = m.prefill(x, max_len=32)
    cfg = m.cfg
    # K and V, fp64, per layer: 2 * capacity * d_model * 8 bytes
    assert small.nbytes() == cfg.n_layer * 2 * 16 * cfg.d_model * 8
    assert big.nbytes() == 2 * small.nbytes()


def test_causality_perturbing_the_future_never_moves_the_past():
    m = _model()
    x = torch.randint(0, 256, (2, 32))
    base = m(x).logits
    for p in (0, 5, 15, 30):
        y = x.clone()
        y[:, p + 1:] = torch.randint(0, 256, y[:, p + 1:].shape)
        moved = (m(y).logits - base).abs()
        assert moved[:, :p + 1].max() < 1e-10
        assert moved[:, p + 1:].max() > 1e-3


def test_loss_ignores_minus_100_targets():
    m = _model()
    x = torch.randint(0, 256, (2, 16))
    t = x.clone()
    t[:, :8] = -100
    out = m(x, t)
    manual = torch.nn.functional.cross_entropy(out.logits[:, 8:].reshape(-1, 256), x[:, 8:].reshape(-1))
    assert torch.allclose(out.loss, manual)
    assert out.aux_loss.item() == 0.0


def test_bad_tokens_raise_clear_errors():
    m = _model()
    with pytest.raises(ValueError, match="vocab_size"):
        m(torch.tensor([[0, 256]]))
    with pytest.raises(ValueError, match="batch, time"):
        m(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="KV cache is full"):
        _, state = m.prefill(torch.tensor([[1, 2]]), max_len=2)
        m.step(torch.tensor([3]), state)


def test_trace_records_attention_weights_only_when_asked():
    m = _model()
    x = torch.randint(0, 256, (1, 16))
    with trace(m, names=["*.attn_weights"]) as t:
        m(x)
    assert t.keys() == ["layer0.attn_weights", "layer1.attn_weights"]
    w = t["layer0.attn_weights"]
    assert w.shape == (1, 2, 16, 16)
    assert torch.allclose(w.sum(-1), torch.ones(1, 2, 16, dtype=w.dtype))
    assert torch.all(w.triu(1) == 0)
    with pytest.raises(KeyError, match="recorded"):
        t["layer9.nothing"]


def test_interface_is_abstract():
    from blockmem_lite.models.base import LanguageModel, State

    with pytest.raises(TypeError, match="abstract"):
        LanguageModel(preset("tiny").model)
    with pytest.raises(TypeError, match="abstract"):
        State()
