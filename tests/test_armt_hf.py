"""ARMT around a Hugging Face Llama model (the optional ``hf`` extra), tiny random weights."""

import inspect
import warnings

import pytest
import torch
from decoding import prefill_then_step

from blockmem_lite.models.armt import ARMT
from blockmem_lite.models.armt_hf import HFBackbone

transformers = pytest.importorskip("transformers")

S, M, T = 8, 2, 20


def _llama(attn_implementation):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation=attn_implementation)
    return transformers.LlamaForCausalLM(config).double().eval()


def _armt(hf_model):
    model = ARMT.wrap(HFBackbone(hf_model), segment_size=S, n_mem_tokens=M, d_mem=4).eval()
    for layer in model.memory.values():
        torch.nn.init.normal_(layer.w_v.weight, std=0.3)
    return model


@pytest.fixture(params=["eager", "sdpa"])
def llama(request):
    return _llama(request.param)


def test_adapter_reproduces_the_hf_logits(llama):
    x = torch.randint(0, 64, (2, T))
    backbone = HFBackbone(llama)
    assert torch.allclose(backbone(x), llama(x).logits, atol=1e-12)
    assert backbone.cfg.d_model == 32 and backbone.cfg.n_layer == 2
    assert backbone.embed is llama.model.embed_tokens          # shared, not copied


def test_single_segment_equals_the_hf_model(llama):
    model = _armt(llama)
    x = torch.randint(0, 64, (2, S))
    assert model.cfg.backbone == "hf"
    assert torch.allclose(model(x).logits, llama(x).logits, atol=1e-12)


def test_memory_changes_later_segments(llama):
    model = _armt(llama)
    x = torch.randint(0, 64, (2, T))
    assert (model(x).logits - llama(x).logits)[:, S:].abs().max() > 1e-3


# HF's eager attention takes its softmax in float32 whatever the input dtype
# (``softmax(..., dtype=torch.float32)``), so in float64 eager is exact only to float32
# rounding. Whether a cached row (kv length t) and the full forward's row (kv length
# S + M, the rest masked) round alike depends on the CPU's vector width: torch sums a
# row in 8-lane pieces with AVX2, 16 with AVX-512, so on an AVX2 machine they differ by
# ~2e-8 (ATEN_CPU_CAPABILITY=default makes them equal again). SDPA stays in float64.
DECODE_ATOL = {"eager": 8 * torch.finfo(torch.float32).eps, "sdpa": 1e-10}


@pytest.mark.parametrize("prompt_len", [3, S, 2 * S + 1])
def test_cached_decode_equals_full_forward_across_segments(llama, prompt_len):
    model = _armt(llama)
    x = torch.randint(0, 64, (2, T))
    full = model(x).logits
    decoded, state = prefill_then_step(model, x, prompt_len)
    atol = DECODE_ATOL[llama.config._attn_implementation]
    assert torch.allclose(decoded, full, atol=atol)
    assert state.caches[0].k.shape == (2, 2, S + M, 8)        # n_kv_heads = 2 (GQA)


def _eager_in_input_dtype(module, query, key, value, attention_mask, scaling, dropout=0.0,
                          **kwargs):
    """HF's eager attention with its softmax in the input's dtype (float64 stays float64)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(2, 3) * scaling                     # (B, H, t, kv)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = scores.softmax(-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


@pytest.mark.parametrize("prompt_len", [3, S])
def test_eager_decode_is_exact_once_its_softmax_keeps_float64(prompt_len):
    """The adapter adds no error of its own: the eager path's gap is HF's float32 softmax."""
    interface = getattr(transformers, "AttentionInterface", None)
    if interface is None:
        pytest.skip("this transformers has no AttentionInterface to register a kernel with")
    interface.register("eager_float64_softmax", _eager_in_input_dtype)
    model = _armt(_llama("eager_float64_softmax"))
    x = torch.randint(0, 64, (2, T))
    decoded, _ = prefill_then_step(model, x, prompt_len)
    assert torch.allclose(decoded, model(x).logits, atol=1e-10)


def test_the_current_cache_keyword_is_used(llama):
    """transformers 5.2x renamed the decoder layer's past_key_values to cache."""
    block = HFBackbone(llama).blocks[0]
    assert block.cache_keyword in inspect.signature(block.layer.forward).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)         # "past_key_values is deprecated"
        prefill_then_step(_armt(llama), torch.randint(0, 64, (1, S + 2)), 3)


def test_other_families_are_a_clear_error():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    with pytest.raises(ValueError, match="model_type='gpt2'.*Llama"):
        HFBackbone(transformers.GPT2LMHeadModel(config))
