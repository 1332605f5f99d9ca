"""ARMT around a Hugging Face Llama model (the optional ``hf`` extra), tiny random weights."""

import pytest
import torch

from blockmem_lite.models.armt import ARMT, HFBackbone

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


@pytest.mark.parametrize("prompt_len", [3, S, 2 * S + 1])
def test_cached_decode_equals_full_forward_across_segments(llama, prompt_len):
    model = _armt(llama)
    x = torch.randint(0, 64, (2, T))
    full = model(x).logits
    logits, state = model.prefill(x[:, :prompt_len])
    pieces = [logits]
    for t in range(prompt_len, T):
        step_logits, state = model.step(x[:, t], state)
        pieces.append(step_logits[:, None])
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    assert state.caches[0].k.shape == (2, 2, S + M, 8)        # n_kv_heads = 2 (GQA)


def test_other_families_are_a_clear_error():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    with pytest.raises(ValueError, match="model_type='gpt2'.*Llama"):
        HFBackbone(transformers.GPT2LMHeadModel(config))
