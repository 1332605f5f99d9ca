"""CAT model: docs/PAPERS.md, Properties the tests check (c3-c7 below), plus errors, padding
and the trace."""

import math

import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.checks import check_causal
from blockmem_lite.masks import cat_mask
from blockmem_lite.models import cat
from blockmem_lite.models.base import State
from blockmem_lite.models.cat import CATLM
from blockmem_lite.nn import Block, RotaryEmbedding, SelfAttention, reference_attention
from blockmem_lite.plugged_in import swap_modules
from blockmem_lite.trace import trace

SIZES = (2, 4, 8)
T = 32


def _model(chunk_sizes=SIZES, chunk_size=4, **kw) -> CATLM:
    torch.manual_seed(0)
    cfg = preset("tiny", arch="cat", chunk_size=chunk_size, chunk_sizes=chunk_sizes, **kw)
    return build_model(cfg).double().eval()


def _both():
    return [_model(()), _model()]


@pytest.mark.parametrize("multi", [False, True])
def test_c3_causal_at_chunk_boundaries_for_every_chunk_size(multi):
    model = _model(SIZES if multi else ())
    x = torch.randint(0, 256, (2, T))
    for c in model.chunk_sizes:
        probes = sorted({c - 1, c, 2 * c - 1, T // 2, T - 2})
        check_causal(lambda t, c=c: model(t, chunk_size=c).logits, x, positions=probes,
                     atol=1e-10, vocab_size=256)


def test_c3_would_catch_a_readout_off_by_one():
    """Reading the last token of a chunk from the wrong slot leaks the next token."""
    from blockmem_lite.models import cat
    from blockmem_lite.ops.cat_layout import n_slots, readout_slots

    def shifted(n_chunks, chunk_size, separator=False, device=None):
        slots = readout_slots(n_chunks, chunk_size, separator, device) + 1  # one slot too late
        return slots.clamp(max=n_slots(n_chunks, chunk_size, separator) - 1)

    class LateReadout(cat.CATLM):
        readout_slots = staticmethod(shifted)

    model = _model(())
    late = LateReadout(model.cfg).double().eval()
    late.load_state_dict(model.state_dict())
    x = torch.randint(0, 256, (1, T))
    check_causal(lambda t: model(t, chunk_size=4).logits, x, positions=[3, 5], atol=1e-10,
                 vocab_size=256)
    with pytest.raises(AssertionError):
        check_causal(lambda t: late(t, chunk_size=4).logits, x,
                     positions=[3, 5], atol=1e-10, vocab_size=256)


@pytest.mark.parametrize("path", ["masked", "reference"])
def test_interleaved_reference_equals_per_chunk_path(path):
    for model in _both():
        x = torch.randint(0, 256, (2, 27))                               # not a multiple of C
        for c in model.chunk_sizes:
            fast = model(x, chunk_size=c).logits
            ref = model(x, chunk_size=c, path=path).logits
            assert torch.allclose(fast, ref, atol=1e-12), (c, path)


def test_padding_the_tail_does_not_change_earlier_logits():
    model = _model(())
    x = torch.randint(0, 256, (1, T))
    for t in (13, 14, 15, 16):
        assert torch.allclose(model(x[:, :t]).logits, model(x).logits[:, :t], atol=1e-12)


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("prompt_len", [1, 3, 4, 9])
def test_c4_c5_cached_decode_equals_full_forward_within_cache_bound(multi, prompt_len):
    model = _model(SIZES if multi else ())
    x = torch.randint(0, 256, (2, T))
    for c in model.chunk_sizes:
        full = model(x, chunk_size=c).logits
        logits, state = model.prefill(x[:, :prompt_len], max_len=T, chunk_size=c)
        assert torch.allclose(logits, full[:, :prompt_len], atol=1e-10)
        bound = T // c + c + (1 if multi else 0)                          # K_max + C (+ SEP)
        assert model.cache_slots(T, c) == bound
        for i in range(prompt_len, T):
            step_logits, state = model.step(x[:, i], state)
            assert state.slots <= bound and state.caches[0].capacity == bound
            assert torch.allclose(step_logits, full[:, i], atol=1e-10), (c, i)
        assert state.n_chunks == T // c                                 # all chunks compressed


@pytest.mark.parametrize("multi", [False, True])
@pytest.mark.parametrize("prompt_len", [2, 8, 19, 29])
def test_chunked_prefill_equals_one_shot_prefill_and_the_full_forward(multi, prompt_len):
    """The prompt read block by block (1 chunk, a few chunks, a block not dividing the
    prompt) gives the one-shot prefill's logits and state, and the same next steps."""
    model = _model(SIZES if multi else ())
    x = torch.randint(0, 256, (2, T))
    for c in model.chunk_sizes:
        full = model(x, chunk_size=c).logits
        one_shot, reference = model.prefill(x[:, :prompt_len], max_len=T, chunk_size=c,
                                            block_tokens=T)
        assert torch.allclose(one_shot, full[:, :prompt_len], atol=1e-10)
        for block_tokens in (1, c, 3 * c, 5 * c + 1):
            logits, state = model.prefill(x[:, :prompt_len], max_len=T, chunk_size=c,
                                          block_tokens=block_tokens)
            assert torch.allclose(logits, one_shot, atol=1e-10), (c, block_tokens)
            assert (state.slots, state.n_chunks) == (reference.slots, reference.n_chunks)
            assert torch.equal(state.pending, reference.pending)
            for mine, theirs in zip(state.caches, reference.caches, strict=True):
                assert mine.capacity == theirs.capacity == model.cache_slots(T, c)
                n = theirs.length
                assert torch.allclose(mine.k[:, :, :n], theirs.k[:, :, :n], atol=1e-10)
                assert torch.allclose(mine.v[:, :, :n], theirs.v[:, :, :n], atol=1e-10)
            for i in range(prompt_len, min(prompt_len + c + 1, T)):      # across a boundary
                step_logits, state = model.step(x[:, i], state)
                assert torch.allclose(step_logits, full[:, i], atol=1e-10), (c, block_tokens, i)
    with pytest.raises(ValueError, match="block_tokens=0"):
        model.prefill(x, block_tokens=0)


@pytest.mark.parametrize("multi", [False, True])
def test_c4_greedy_decode_matches_argmax_of_full_forward_over_boundaries(multi):
    model = _model(SIZES if multi else ())
    prompt = torch.randint(0, 256, (2, 5))
    for c in model.chunk_sizes:
        model.chunk_size = c
        out = model.generate(prompt, max_new_tokens=2 * c + 3, greedy=True)   # >= 2 boundaries
        seq = prompt
        for _ in range(2 * c + 3):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
        assert torch.equal(out, seq), c


def test_state_holds_only_compressed_past_and_reports_bytes():
    model = _model(())
    x = torch.randint(0, 256, (1, T))
    _, state = model.prefill(x, max_len=T)
    assert isinstance(state, State)
    assert state.slots == 1 + T // 4                                     # g_0 + f_0..f_7
    width, layers = model.width, model.cfg.n_layer
    cache_bytes = 2 * layers * model.cache_slots(T, 4) * width * 8        # k and v, fp64
    assert state.nbytes() == cache_bytes
    dense_bytes = 2 * layers * T * model.cfg.d_model * 8
    assert state.nbytes() < dense_bytes


def test_c6_every_compressor_parameter_gets_a_gradient():
    for model in _both():
        model.train()
        x = torch.randint(0, 256, (2, T))
        model(x, x).loss.backward()
        for name, p in model.compressor.named_parameters():
            if name == "size_token.weight":        # only the sampled size's row is used
                continue
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name


def test_the_compressor_learns_at_its_own_rate():
    """Every compressor parameter, and only those, gets ``compressor_lr_scale`` x lr."""
    from blockmem_lite.train import make_optimizer

    run = preset("tiny", arch="cat", compressor_lr_scale=0.5)
    model = build_model(run)
    rates = {id(p): group["lr"] for group in make_optimizer(model, run.train).param_groups
             for p in group["params"]}
    for name, p in model.named_parameters():
        scale = 0.5 if name.startswith("compressor.") else 1.0
        assert rates[id(p)] == pytest.approx(scale * run.train.lr), name
    assert set(build_model(preset("tiny", arch="cat")).lr_scales().values()) == {0.25}


def test_c7_bilinear_resize_is_identity_at_the_largest_chunk():
    model = _model()
    comp = model.compressor
    assert comp.projection(8) is comp.proj.weight
    assert torch.equal(torch.nn.functional.interpolate(
        comp.proj.weight[None, None], size=comp.proj.weight.shape, mode="bilinear",
        align_corners=False)[0, 0], comp.proj.weight)
    for c in (2, 4):
        assert comp.projection(c).shape == (model.width, c * model.cfg.d_model)


def test_c7_other_chunk_sizes_first_never_change_logits():
    model = _model()
    x = torch.randint(0, 256, (2, T))
    first = model(x, chunk_size=4).logits
    for c in (8, 2, 8):
        model(x, chunk_size=c)
        model.generate(x[:, :5], 3, greedy=True)
    assert torch.equal(model(x, chunk_size=4).logits, first)


def test_multi_chunk_training_samples_every_size_and_eval_uses_the_knob():
    model = _model().train()
    x = torch.randint(0, 256, (1, T))
    seen = set()
    torch.manual_seed(1)
    for _ in range(40):
        with trace(names=["compressed"]) as t:
            model(x)
        seen.add(T // t["compressed"].shape[1])
    assert seen == set(SIZES)
    model.eval()
    model.chunk_size = 2
    assert torch.equal(model(x).logits, model(x, chunk_size=2).logits)


def test_trace_records_mask_compressed_vectors_and_attention_split():
    model = _model(())
    x = torch.randint(0, 256, (1, 12))
    with trace(model) as t:
        model(x)
    k, c = 3, 4
    assert torch.equal(t["mask"], cat_mask(k, c))
    assert t["compressed"].shape == (1, k, model.width)
    weights = t["layer0.attn_weights"]
    assert weights.shape[-1] == k * (c + 1) + 1
    share = t["layer0.compressed_share"]                                  # (B, H, S)
    assert torch.allclose(share[..., 0], torch.ones_like(share[..., 0]))  # g_0 sees itself only
    assert ((share > 0) & (share <= 1 + 1e-12)).all()


class _MaskedSoftmax(torch.nn.Module):
    """A learner's decoder attention as notebook 05 asks for it: plain softmax under
    ``cat_mask``, with CATAttention's parameter names; it records how the model calls it."""

    def __init__(self, dim, n_head, rope_base):
        super().__init__()
        self.n_head = n_head
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.rope = RotaryEmbedding(dim // n_head, rope_base)
        self.calls = []

    def forward(self, x, positions, n_chunks, chunk_size, separator=False):
        self.calls.append((n_chunks, chunk_size, separator))
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        y, _ = reference_attention(self.rope(q, positions), self.rope(k, positions), v,
                                   mask=cat_mask(n_chunks, chunk_size, separator))
        return self.out(y.transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("multi", [False, True])
def test_the_decoder_attention_is_a_module_a_learner_can_swap_in(multi):
    model, swapped = _model(SIZES if multi else ()), _model(SIZES if multi else ())
    assert all(type(b.attn) is cat.CATAttention for b in model.blocks)
    assert all(type(b.attn) is SelfAttention for b in model.compressor.blocks)
    made = []

    def make(old):
        made.append(_MaskedSoftmax(old.qkv.in_features, old.n_head, old.rope.base).double())
        return made[-1]

    assert swap_modules(swapped, cat.CATAttention, make) == len(model.blocks)
    assert all(type(b.attn) is SelfAttention for b in swapped.compressor.blocks)
    tokens = torch.randint(0, 256, (2, T - 3))
    with torch.no_grad():
        for c in model.chunk_sizes:
            torch.testing.assert_close(swapped(tokens, chunk_size=c).logits,
                                       model(tokens, chunk_size=c).logits, rtol=0, atol=1e-12)
            assert made[0].calls[-1] == (math.ceil((T - 3) / c), c, multi)
    check_causal(swapped, tokens)


def test_cat_attention_is_self_attention_without_a_layout():
    """A decoder block holds a plain Block's parameter names (so the keyed init draws it the
    same weights) and, without a CAT layout, computes the same function."""
    block = cat._decoder_block(16, 2, 8 / 3, 10000.0, 1e-5, 0.0)
    plain = Block(16, 2, 8 / 3, 10000.0, 1e-5, 0.0)
    assert list(block.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(block.state_dict())
    x, positions = torch.randn(2, 7, 16), torch.arange(7)
    torch.testing.assert_close(block(x, positions), plain(x, positions), rtol=0, atol=0)


def test_decoder_width_and_heads_keep_the_head_dim():
    for mult in (1, 2, 3):
        model = _model((), decoder_width=mult)
        assert model.width == mult * model.cfg.d_model
        assert model.blocks[0].attn.head_dim == model.cfg.head_dim
    assert len(_model((), n_layer=8).compressor.blocks) == 2             # max(1, L // 4)
    assert len(_model((), compressor_layers=3).compressor.blocks) == 3


@pytest.mark.parametrize("fields, message", [
    (dict(chunk_size=64), "chunk_size=64 is not allowed"),
    (dict(chunk_sizes=(4, 6)), "powers of two"),
    (dict(chunk_sizes=(4, 64)), "seq_len=32"),
    (dict(chunk_sizes=(2, 8), chunk_size=4), "pick one of them"),
    (dict(decoder_width=0), "decoder_width=0"),
    (dict(chunk_sizes=[4, 4]), "each chunk size once"),
    (dict(compressor_lr_scale=-0.5), "compressor_lr_scale=-0.5"),
])
def test_bad_config_is_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", arch="cat", **fields)


def test_bad_use_is_a_clear_error():
    model = _model()
    x = torch.randint(0, 256, (1, T))
    with pytest.raises(ValueError, match="chunk_size=16 is not allowed: this model serves 2, 4, 8"):
        model(x, chunk_size=16)
    with pytest.raises(ValueError, match="chunk_size=3 is not allowed"):
        model.chunk_size = 3
    with pytest.raises(ValueError, match="sequence length 33 is not allowed"):
        model(torch.randint(0, 256, (1, T + 1)))
    with pytest.raises(ValueError, match="path='flex' is not allowed"):
        model(x, path="flex")
    with pytest.raises(ValueError, match="max_len=1000 is not allowed at chunk_size=8"):
        model.prefill(x[:, :4], max_len=1000, chunk_size=8)


def test_generation_stops_with_a_clear_error_past_the_chunk_index_table():
    model = _model(())
    limit = model.max_tokens(4)
    assert limit == math.ceil(T / 4) * 4
    _, state = model.prefill(torch.randint(0, 256, (1, limit - 1)), max_len=limit)
    model.step(torch.tensor([1]), state)                                  # fills the last chunk
    assert state.n_chunks == limit // 4
    model.step(torch.tensor([1]), state)
    with pytest.raises(ValueError, match="generation past"):
        for _ in range(4):
            model.step(torch.tensor([1]), state)


def test_train_cli_parses_chunk_sizes_into_a_tuple():
    from blockmem_lite.tools.train_command import parse_value as _parse_value

    assert _parse_value("4,8,16,32") == (4, 8, 16, 32)
    assert _parse_value("8,") == (8,)
    cfg = preset("tiny", arch="cat", chunk_sizes=_parse_value("2,4,8"), chunk_size=4)
    assert build_model(cfg).chunk_sizes == (2, 4, 8)
