"""BCMT / HOnly: docs/PAPERS.md, Properties the tests check (b1-b7 below), plus errors and
padding."""

import pytest
import torch
from decoding import prefill_then_step

from blockmem_lite import build_model, preset
from blockmem_lite.models.bcmt import (
    block_summaries,
    decay_weights,
    memory_matrix_form,
    memory_scan_form,
    shift_one_block,
)
from blockmem_lite.trace import trace

L = 8


def _model(arch="bcmt", block_size=L, **kw):
    model = build_model(preset("tiny", arch=arch, block_size=block_size, **kw)).double().eval()
    # give the gate a clear opening so the memory path carries real signal
    for layer in model.blocks:
        if layer.has_memory:
            torch.nn.init.normal_(layer.memory_proj.weight, std=0.3)
    return model


def test_b1_scan_equals_matrix_and_rows_sum_to_one():
    s = torch.randn(3, 9, 5, dtype=torch.float64)
    for alpha in (0.0, 0.3, 0.8, 1.0):
        assert torch.allclose(memory_matrix_form(s, alpha), memory_scan_form(s, alpha), atol=1e-12)
        w = decay_weights(9, alpha, torch.float64)
        assert torch.allclose(w.sum(-1), torch.ones(9, dtype=torch.float64))
        assert torch.all(w.triu(1) == 0)


def test_decay_weights_stay_finite_for_many_blocks():
    w = decay_weights(2000, 0.8, torch.float32)
    assert torch.isfinite(w).all()
    assert torch.allclose(w.sum(-1), torch.ones(2000), atol=1e-5)


def test_b2_one_block_is_exactly_dense():
    bcmt = _model(block_size=32)
    dense = build_model(preset("tiny")).double().eval()
    result = dense.load_state_dict(bcmt.state_dict(), strict=False)
    assert not result.missing_keys
    x = torch.randint(0, 256, (2, 32))
    assert torch.allclose(bcmt(x).logits, dense(x).logits, atol=1e-12)


def test_b3_honly_equals_independent_blocks():
    model = _model("honly")
    x = torch.randint(0, 256, (2, 32))
    full = model(x).logits
    # each block alone, at its own absolute positions (RoPE is relative, so any offset works)
    per_block = torch.cat([model(x[:, i:i + L]).logits for i in range(0, 32, L)], dim=1)
    assert torch.allclose(full, per_block, atol=1e-10)


@pytest.mark.parametrize("arch", ["bcmt", "honly"])
def test_b4_causality_at_block_boundaries(arch):
    model = _model(arch)
    t = 32
    x = torch.randint(0, 256, (2, t))
    base = model(x).logits
    for p in (L - 1, L, 2 * L - 1, t // 2, t - 2):
        y = x.clone()
        y[:, p + 1:] = torch.randint(0, 256, y[:, p + 1:].shape)
        moved = (model(y).logits - base).abs()
        assert moved[:, :p + 1].max() < 1e-10, f"position <= {p} saw the future"
        assert moved[:, p + 1:].max() > 1e-3, "later positions must move (test has teeth)"


def test_memory_carries_information_across_blocks_and_honly_does_not():
    x = torch.randint(0, 256, (2, 32))
    y = x.clone()
    y[:, :L] = torch.randint(0, 256, (2, L))  # change block 0 only
    bcmt, honly = _model(), _model("honly")
    moved_bcmt = (bcmt(y).logits - bcmt(x).logits).abs()[:, L:]
    moved_honly = (honly(y).logits - honly(x).logits).abs()[:, L:]
    assert moved_bcmt.max() > 1e-3
    assert moved_honly.max() < 1e-12


def test_without_shift_the_memory_leaks():
    """The missing shift (docs/PAPERS.md, BCMT equations): M_i instead of M_{i-1} lets a block
    see its future."""
    s = torch.randn(1, 4, 3, dtype=torch.float64)
    unshifted, shifted = memory_matrix_form(s, 0.8), shift_one_block(memory_matrix_form(s, 0.8))
    s2 = s.clone()
    s2[:, 2] += 1.0  # block 2's summary changes (its own future tokens could do this)
    assert torch.allclose(shift_one_block(memory_matrix_form(s2, 0.8))[:, 2], shifted[:, 2])
    assert not torch.allclose(memory_matrix_form(s2, 0.8)[:, 2], unshifted[:, 2])


@pytest.mark.parametrize("arch", ["bcmt", "honly"])
@pytest.mark.parametrize("prompt_len", [1, L - 1, L, 2 * L + 3])
def test_b5_cached_generation_equals_full_forward(arch, prompt_len):
    model = _model(arch)
    x = torch.randint(0, 256, (2, 30))  # crosses 3 block boundaries, not a multiple of L
    full = model(x).logits
    logits, state = model.prefill(x[:, :prompt_len])
    pieces = [logits]
    for t in range(prompt_len, 30):
        step_logits, state = model.step(x[:, t], state)
        pieces.append(step_logits[:, None])
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    assert max(layer.cache.length for layer in state.layers) <= L


@pytest.mark.parametrize("prompt_len", [1, L + 3])
def test_b5_holds_for_no_grad_decoding_and_a_second_session_repeats_it(prompt_len):
    model = _model()
    x = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        full = model(x).logits
        decoded, state = prefill_then_step(model, x, prompt_len)
        again, _ = prefill_then_step(model, x, prompt_len)
    assert torch.allclose(decoded, full, atol=1e-10) and torch.equal(decoded, again)
    assert state.layers[0].block_u.shape == (2, L, model.cfg.d_model)   # the open block's U


def test_b5_decoding_follows_a_weight_change():
    model = _model()
    x = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        prefill_then_step(model, x, 1)
        for layer in model.blocks:
            layer.gate.weight.mul_(-1.5)                           # in place: new version
            layer.score.weight.add_(0.3)
        decoded, _ = prefill_then_step(model, x, 1)
        assert torch.allclose(decoded, model(x).logits, atol=1e-10)


def test_b5_large_summary_scores_still_equal_the_full_forward():
    model = _model()
    with torch.no_grad():
        for layer in model.blocks:               # |a_t| up to ~1e3: a naive exp overflows
            layer.score.weight.normal_(std=60.0)
    x = torch.randint(0, 256, (2, 30))
    decoded, _ = prefill_then_step(model, x, 3)
    assert torch.allclose(decoded, model(x).logits, atol=1e-10)


def test_decoding_gates_equal_the_full_forward_gates_from_the_first_token():
    model = _model()
    x = torch.randint(0, 256, (1, 2 * L + 2))
    with trace(model) as full:
        model(x)
    state = model.new_state(1)
    with trace(model) as steps:
        for t in range(x.shape[1]):
            model.step(x[:, t], state)
    gates = steps.all("gate")                              # per step, layer by layer: (1, 1, D)
    n_layer = model.cfg.n_layer
    for i in range(n_layer):
        decoded = torch.cat(gates[i::n_layer], dim=1)      # (1, T, D)
        assert torch.allclose(decoded, full[f"layer{i}.gate"][:, :x.shape[1]], atol=1e-10), i


def test_greedy_generation_matches_full_forward_argmax():
    model = _model()
    out = model.generate(torch.randint(0, 256, (1, 5)), 20, greedy=True)
    full = model(out[:, :-1]).logits
    assert torch.equal(full[:, 4:].argmax(-1), out[:, 5:])


def test_decode_state_is_constant_in_length():
    model = _model()
    _, short = model.prefill(torch.randint(0, 256, (1, 9)))
    _, long = model.prefill(torch.randint(0, 256, (1, 200)))
    assert short.nbytes() == long.nbytes()
    d = model.cfg.d_model     # per layer: KV 2Ld, the open block's U Ld, num, P, gate bias, den
    assert short.nbytes() == model.cfg.n_layer * (3 * L * d + 3 * d + 1) * 8          # fp64


def test_b6_alpha_limits():
    s = torch.randn(2, 5, 4, dtype=torch.float64)
    near_zero = shift_one_block(memory_matrix_form(s, 1e-9))
    assert torch.allclose(near_zero[:, 1:], s[:, :-1], atol=1e-7)   # previous block only
    uniform = memory_matrix_form(s, 1.0)
    means = torch.cumsum(s, 1) / torch.arange(1, 6, dtype=torch.float64)[None, :, None]
    assert torch.allclose(uniform, means, atol=1e-12)


def test_b7_summary_is_permutation_invariant_inside_a_block():
    states = torch.randn(2, 2 * L, 6, dtype=torch.float64)
    scores = torch.randn(2, 2 * L, dtype=torch.float64)
    perm = torch.cat([torch.randperm(L), L + torch.randperm(L)])
    s1, _ = block_summaries(states, scores, L)
    s2, _ = block_summaries(states[:, perm], scores[:, perm], L)
    assert torch.allclose(s1, s2, atol=1e-12)


def test_padding_is_masked_out_of_the_summary():
    states = torch.randn(1, 2 * L, 4, dtype=torch.float64)
    scores = torch.randn(1, 2 * L, dtype=torch.float64)
    _, w = block_summaries(states, scores, L, n_valid=L + 3)
    assert torch.all(w[0, 1, 3:] == 0)
    assert torch.allclose(w.sum(-1), torch.ones(1, 2, dtype=torch.float64))


def test_prefix_logits_do_not_depend_on_padding():
    model = _model()
    x = torch.randint(0, 256, (1, 19))  # 19 is not a multiple of 8
    assert torch.allclose(model(x).logits, model(torch.cat([x, x[:, :5]], 1)).logits[:, :19],
                          atol=1e-10)


def test_trace_records_the_memory_pieces():
    model = _model()
    with trace(model) as t:
        model(torch.randint(0, 256, (1, 32)))
    w = t["layer0.decay_weights"]
    assert w.shape == (4, 4) and torch.allclose(w.sum(-1), torch.ones(4, dtype=w.dtype))
    assert t["layer0.summary_weights"].shape == (1, 4, L)
    assert t["layer1.gate"].shape == (1, 32, model.cfg.d_model)
    assert torch.all(t["layer0.memory"][:, 0] == 0)  # block 0 reads zeros


@pytest.mark.parametrize("block_size, message", [
    (0, "block_size=0"),
    (33, "block_size=33.*seq_len=32"),
])
def test_bad_block_size_is_a_clear_error(block_size, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", arch="bcmt", block_size=block_size)


def test_bad_alpha_is_a_clear_error():
    with pytest.raises(ValueError, match=r"alpha=1.5.*\[0.0, 1.0\]"):
        preset("tiny", arch="bcmt", alpha=1.5)


def test_learnable_alpha_gets_a_gradient():
    model = _model(learn_alpha=True).train()
    x = torch.randint(0, 256, (2, 32))
    model(x, x).loss.backward()
    assert model.blocks[0].alpha.grad is not None and model.blocks[0].alpha.grad.abs() > 0


def test_fresh_bcmt_equals_honly_and_learns_its_memory():
    bcmt = build_model(preset("tiny", arch="bcmt")).double()
    honly = build_model(preset("tiny", arch="honly")).double()   # the same draws, by name
    x = torch.randint(0, 256, (2, 32))
    assert torch.equal(bcmt(x).logits, honly(x).logits)   # W_p = 0: no memory yet
    bcmt(x, x).loss.backward()
    assert bcmt.blocks[0].memory_proj.weight.grad.abs().max() > 0   # but W_p learns


def test_the_memory_path_learns_at_its_own_rate():
    """W_p, the gate and the summary's score and norm get ``memory_lr_scale`` x lr; the
    backbone, and HOnly, the full rate."""
    from blockmem_lite.train import make_optimizer

    run = preset("tiny", arch="bcmt")
    model = build_model(run)
    scales = model.lr_scales()
    assert {"blocks.0.memory_proj.weight", "blocks.0.gate.bias", "blocks.0.score.weight",
            "blocks.1.summary_norm.weight"} <= set(scales)
    assert set(scales.values()) == {0.1}
    assert not any(part in name for name in scales for part in ("attn", "mlp", "norm1"))
    rates = {id(p): group["lr"] for group in make_optimizer(model, run.train).param_groups
             for p in group["params"]}
    params = dict(model.named_parameters())
    assert rates[id(params["blocks.0.memory_proj.weight"])] == pytest.approx(0.1 * run.train.lr)
    assert rates[id(params["blocks.0.attn.qkv.weight"])] == pytest.approx(run.train.lr)
    assert build_model(preset("tiny", arch="honly")).lr_scales() == {}
    with pytest.raises(ValueError, match="memory_lr_scale=-1"):
        preset("tiny", arch="bcmt", memory_lr_scale=-1.0)
