"""ARMT's Hugging Face adapter: a Llama causal LM seen as a kit backbone (the ``hf`` extra).

``ARMT.wrap(HFBackbone(hf_model), segment_size=...)`` wraps a pretrained Hugging Face
Llama model; its weights are shared, not copied. ``HFBackbone`` offers what ARMT needs
of a backbone (``models/armt.py``): ``embed``, ``blocks`` callable as
``block(x, positions, cache)``, ``norm``, ``head``, ``cfg`` and ``new_state``. The
adapter imports nothing from transformers itself: the caller brings the model.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from blockmem_lite.config import ModelConfig
from blockmem_lite.masks import causal_mask
from blockmem_lite.models.dense import DenseState
from blockmem_lite.nn import KVCache


class _HFCacheView:
    """The one Cache method an HF Llama attention calls, backed by a kit ``nn.KVCache``."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.cache.append(key_states, value_states)


# The decoder layer's name for its KV cache argument: ``cache`` from transformers 5.2x on
# (``past_key_values`` there is deprecated, to be removed in 5.40), ``past_key_values``
# from 4.56, ``past_key_value`` before that.
_HF_CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")


def _hf_cache_keyword(layer: nn.Module) -> str:
    """The keyword this HF decoder layer takes its cache by (read off its signature)."""
    parameters = inspect.signature(layer.forward).parameters
    for name in _HF_CACHE_KEYWORDS:
        if name in parameters:
            return name
    raise ValueError(f"hf_model's decoder layer {type(layer).__name__} takes none of "
                     f"{_HF_CACHE_KEYWORDS} as its cache argument: this transformers version "
                     "is not supported (see docs/INSTALL.md for the tested ones)")


class _HFBlock(nn.Module):
    """An HF decoder layer callable as ``block(x, positions, cache)`` like a kit Block."""

    def __init__(self, layer: nn.Module, rotary: nn.Module):
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.cache_keyword = _hf_cache_keyword(layer)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None) -> torch.Tensor:
        position_ids = positions[None]                                          # (1, T)
        cos_sin = self.rotary(x, position_ids)
        q_len = x.shape[1]
        kv_len = q_len + (cache.length if cache is not None else 0)
        mask = None
        if q_len > 1:      # explicit, bottom-right: HF's own causal shortcut assumes no cache
            allowed = causal_mask(q_len, kv_len, device=x.device)
            mask = torch.zeros(q_len, kv_len, device=x.device, dtype=x.dtype)
            mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]
        past = {self.cache_keyword: _HFCacheView(cache) if cache is not None else None}
        out = self.layer(x, attention_mask=mask, position_ids=position_ids,
                         position_embeddings=cos_sin, **past)
        return out[0] if isinstance(out, tuple) else out


class HFBackbone(nn.Module):
    """A Hugging Face Llama causal LM seen through the kit's embed / blocks / norm / head.

    ``ARMT.wrap(HFBackbone(hf_model), segment_size=...)`` wraps it; the HF
    weights are shared, not copied. Only ``model_type == "llama"`` is accepted:
    other families differ in ways an adapter would silently get wrong (scaled
    embeddings, sliding windows, learned positions). Decoding uses kit
    ``KVCache`` objects (``num_key_value_heads`` heads) through the one Cache
    method the attention calls, ``update``; masks are passed explicitly
    (additive, bottom-right causal), so eager and SDPA attention both work.
    ``cfg`` is a ModelConfig describing the shapes (arch "dense" of the same
    width, depth and vocabulary); ``backbone_arch`` is "hf".
    """

    backbone_arch = "hf"

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        config = getattr(hf_model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type != "llama" or not hasattr(hf_model, "model"):
            raise ValueError(f"hf_model with model_type={model_type!r} is not allowed: "
                             "HFBackbone supports Hugging Face Llama causal LMs "
                             "(LlamaForCausalLM) only")
        inner = hf_model.model
        self.embed = inner.embed_tokens
        self.blocks = nn.ModuleList(_HFBlock(layer, inner.rotary_emb) for layer in inner.layers)
        self.norm = inner.norm
        self.head = hf_model.lm_head
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        self.cfg = ModelConfig(arch="dense", vocab_size=config.vocab_size,
                               d_model=config.hidden_size, n_layer=len(self.blocks),
                               n_head=config.num_attention_heads,
                               seq_len=config.max_position_embeddings,
                               mlp_ratio=config.intermediate_size / config.hidden_size,
                               norm_eps=config.rms_norm_eps, init_std=config.initializer_range)

    def new_state(self, batch: int, max_len: int):
        """Empty KV caches of ``max_len`` slots, one per layer (``.caches``)."""
        p = self.embed.weight
        return DenseState([KVCache(batch, self.n_kv_heads, max_len, self.head_dim, p.device,
                                   p.dtype) for _ in self.blocks])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V) through the adapter (equals the HF model's)."""
        x = self.embed(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        for block in self.blocks:
            x = block(x, positions, None)
        return self.head(self.norm(x))
