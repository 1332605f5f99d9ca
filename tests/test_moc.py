"""MoC: docs/PAPERS.md, Properties the tests check (m1-m9 below), plus routing modes, state,
trace, config and errors."""

import copy
import dataclasses
import math

import pytest
import torch

from blockmem_lite import ModelConfig, build_model, preset
from blockmem_lite.checks import CheckFailed, check_causal
from blockmem_lite.measure import metrics
from blockmem_lite.models.moc import (
    MemoryRead,
    MoCBlock,
    _block_options,
    chapter_weights,
    default_memory_layers,
    gather_chapters,
    load_balance_loss,
    prefix_means,
    z_loss,
)
from blockmem_lite.plugged_in import swap_modules
from blockmem_lite.trace import trace

R = 8        # routing window of the test models
T = 32       # their context: 4 windows
MEM = 1      # the memory layer of a 2-layer model (default: the middle layer)


def _model(wo_std=0.3, **kw):
    """A tiny fp64 MoC; W_O re-randomised (``wo_std``) so the memory path carries signal."""
    kw = {"seq_len": T, "routing_window": R, **kw}
    model = build_model(preset("tiny", arch="moc", **kw)).double().eval()
    if wo_std:
        for i in model.memory_layers:
            torch.nn.init.normal_(model.blocks[i].memory.out.weight, std=wo_std)
    return model


def _tokens(batch=2, length=T, seed=0):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- M1: a fresh MoC is its backbone -------------------------------------------------------

def test_m1_fresh_moc_equals_the_dense_backbone_exactly():
    fresh = _model(wo_std=0)
    dense = build_model(preset("tiny", seq_len=T)).double().eval()
    result = dense.load_state_dict(fresh.state_dict(), strict=False)
    assert not result.missing_keys
    assert "bank" in result.unexpected_keys
    x = _tokens()
    assert torch.equal(fresh(x).logits, dense(x).logits)
    torch.nn.init.normal_(fresh.blocks[MEM].memory.out.weight, std=0.3)   # teeth
    assert (fresh(x).logits - dense(x).logits).abs().max() > 1e-3


def test_w_o_starts_at_zero_and_the_rest_is_initialised():
    model = build_model(preset("tiny", arch="moc"))
    block = model.blocks[MEM]
    assert torch.count_nonzero(block.memory.out.weight) == 0
    assert torch.count_nonzero(block.router.bias) == 0
    assert model.bank.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.bank.shape == (17 * 8, 32)
    assert block.route_start.abs().sum() > 0


# --- M2, M3: gather and weights --------------------------------------------------------------

def test_m2_gather_returns_the_chapter_rows_in_order():
    chapter_len, dim = 4, 3
    bank = torch.arange(6 * chapter_len * dim, dtype=torch.float64).view(-1, dim)
    ids = torch.tensor([[0, 5, 2], [0, 1, 4]])
    got = gather_chapters(bank, ids, chapter_len)                         # (2, 12, 3)
    assert got.shape == (2, 3 * chapter_len, dim)
    for row in range(2):
        expected = torch.cat([bank[c * chapter_len:(c + 1) * chapter_len] for c in ids[row]])
        assert torch.equal(got[row], expected)


@pytest.mark.parametrize("routed_scale", [2.5, 1.0])
def test_m3_weights_sum_to_one_shared_first_routed_proportional(routed_scale):
    probs = torch.randn(4, 3, 17, dtype=torch.float64).softmax(-1)
    ids, weights = chapter_weights(probs, 5, routed_scale)
    assert ids.shape == weights.shape == (4, 3, 6)
    assert torch.allclose(weights.sum(-1), torch.ones(4, 3, dtype=torch.float64))
    assert torch.all(ids[..., 0] == 0)
    assert torch.allclose(weights[..., 0], torch.full((4, 3), 1 / (1 + routed_scale),
                                                      dtype=torch.float64))
    expected_ids = probs[..., 1:].topk(5, dim=-1).indices + 1
    assert torch.equal(ids[..., 1:], expected_ids)
    chosen = probs.gather(-1, ids[..., 1:])
    share = chosen / chosen.sum(-1, keepdim=True)                         # renormalised top-k
    assert torch.allclose(weights[..., 1:], routed_scale / (1 + routed_scale) * share)


def test_paper_shared_weight_is_one_over_three_and_a_half():
    _, weights = chapter_weights(torch.rand(2, 4097).softmax(-1), 64, 2.5)
    assert weights[:, 0].tolist() == pytest.approx([1 / 3.5] * 2)
    assert weights[:, 1:].sum(-1).tolist() == pytest.approx([2.5 / 3.5] * 2)


# --- M4, M5: gradients ---------------------------------------------------------------------

def test_m4_router_learns_from_the_ce_loss_alone():
    model = _model(lb_coef=0.0, z_coef=0.0).train()
    x = _tokens()
    out = model(x, x)
    assert out.aux_loss.item() == 0.0
    out.loss.backward()
    router = model.blocks[MEM].router
    assert router.weight.grad.abs().max() > 1e-8
    assert model.blocks[MEM].route_start.grad.abs().max() > 1e-8


def test_m5_unselected_chapters_get_exactly_zero_gradient():
    from blockmem_lite.config import TrainConfig
    from blockmem_lite.train import make_optimizer

    model = _model().train()
    x = _tokens(batch=1)
    logits, routings = model._run_layers(x)
    selected = set(routings[0].chapter_ids.flatten().tolist())
    assert len(selected) < model.cfg.n_chapters                         # some are left out
    torch.nn.functional.cross_entropy(logits[0], x[0]).backward()
    grad = model.bank.grad.view(model.cfg.n_chapters, model.cfg.chapter_len, -1)
    for c in range(model.cfg.n_chapters):
        if c in selected:
            assert grad[c].abs().max() > 0, f"selected chapter {c} got no gradient"
        else:
            assert torch.count_nonzero(grad[c]) == 0, f"chapter {c} was not read"
    before = model.bank.detach().clone()
    make_optimizer(model, TrainConfig(weight_decay=0.0)).step()
    moved = (model.bank.detach() - before).view_as(grad).abs().amax(dim=(1, 2))
    assert [c for c in range(model.cfg.n_chapters) if moved[c] > 0] == sorted(selected)


@pytest.mark.parametrize("strategy", ["gather", "project"])
def test_both_key_value_paths_agree_and_keep_the_gradient_sparse(strategy):
    torch.manual_seed(1)
    read = MemoryRead(16, 2, chapter_len=4, norm_eps=1e-5).double()
    bank = torch.randn(10 * 4, 16, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 3, 7], [0, 7, 2]])
    weights = torch.tensor([[0.3, 0.5, 0.2], [0.3, 0.1, 0.6]], dtype=torch.float64)
    k, v = read.keys_values(bank, ids, weights, strategy)
    k_ref, v_ref = read.keys_values(bank, ids, weights, "gather")
    assert k.shape == (2, 2, 12, 8)
    assert torch.allclose(k, k_ref, atol=1e-12) and torch.allclose(v, v_ref, atol=1e-12)
    (k.sum() + v.pow(2).sum()).backward()
    per_chapter = bank.grad.view(10, 4, 16).abs().amax(dim=(1, 2))
    assert [c for c in range(10) if per_chapter[c] > 0] == [0, 2, 3, 7]


def test_both_key_value_paths_have_equal_gradients():
    """Project-then-gather is gather-then-project reordered: equal gradients for the bank, the
    chapter weights and W_K|W_V, not only equal K and V."""
    torch.manual_seed(2)
    read = MemoryRead(16, 2, chapter_len=4, norm_eps=1e-5).double()
    bank = torch.randn(10 * 4, 16, dtype=torch.float64)
    ids = torch.tensor([[0, 3, 7], [0, 7, 2], [0, 3, 3]])
    weights = torch.rand(3, 3, dtype=torch.float64)
    dk, dv = torch.randn(2, 3, 2, 12, 8, dtype=torch.float64)      # cotangents of K and V
    grads = {}
    for strategy in ("gather", "project"):
        read.zero_grad()
        b, w = bank.clone().requires_grad_(), weights.clone().requires_grad_()
        k, v = read.keys_values(b, ids, w, strategy)
        ((k * dk).sum() + (v * dv).sum()).backward()
        grads[strategy] = (b.grad, w.grad, read.kv.weight.grad.clone())
    for got, want in zip(grads["project"], grads["gather"], strict=True):
        assert torch.allclose(got, want, atol=1e-12)


def test_auto_strategy_projects_the_bank_when_the_batch_gathers_more_rows():
    read = MemoryRead(16, 2, chapter_len=4, norm_eps=1e-5)
    bank = torch.randn(3 * 4, 16)
    many = torch.zeros(5, 2, dtype=torch.long)              # 5 * 2 * 4 = 40 rows > 12
    weights = torch.full((5, 2), 0.5)
    calls = []
    read.kv.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    read.keys_values(bank, many, weights)
    assert calls == [12]                                     # the bank's rows, projected once
    with pytest.raises(ValueError, match="strategy='dense' is not allowed"):
        read.keys_values(bank, many, weights, "dense")


# --- M6: auxiliary losses ------------------------------------------------------------------

def test_m6_uniform_router_gives_lb_k_and_z_ln_c_squared():
    n_chapters, k = 17, 3
    probs = torch.full((6, n_chapters), 1 / n_chapters, dtype=torch.float64)
    routed = torch.stack([torch.randperm(16)[:k] + 1 for _ in range(6)])
    assert load_balance_loss(probs, routed).item() == pytest.approx(k)
    logits = torch.zeros(6, n_chapters, dtype=torch.float64)
    assert z_loss(logits).item() == pytest.approx(math.log(n_chapters) ** 2)


def test_m6_in_the_model_and_aux_is_the_weighted_mean():
    model = _model(top_k=3, lb_coef=0.5, z_coef=0.25)
    router = model.blocks[MEM].router
    torch.nn.init.zeros_(router.weight)
    out = model(_tokens(), _tokens(seed=1))
    assert out.extras["lb_loss"].item() == pytest.approx(3)
    assert out.extras["z_loss"].item() == pytest.approx(math.log(17) ** 2)
    expected = 0.5 * 3 + 0.25 * math.log(17) ** 2
    assert out.aux_loss.item() == pytest.approx(expected)
    assert out.loss.item() == pytest.approx(out.ce_loss.item() + expected)


def test_load_balance_punishes_a_collapsed_router():
    probs = torch.zeros(8, 5, dtype=torch.float64)
    probs[:, 1] = 1.0
    routed = torch.ones(8, 1, dtype=torch.long)
    assert load_balance_loss(probs, routed).item() == pytest.approx(5.0)   # vs 1 when uniform


# --- routing inputs -----------------------------------------------------------------------

def test_prefix_means_average_everything_before_each_window():
    hidden = torch.randn(2, 11, 3, dtype=torch.float64)
    means = prefix_means(hidden, 4)                                        # windows at 0, 4, 8
    assert means.shape == (2, 3, 3)
    assert torch.equal(means[:, 0], torch.zeros(2, 3, dtype=torch.float64))
    for w in (1, 2):
        assert torch.allclose(means[:, w], hidden[:, :4 * w].mean(dim=1))


def test_window_zero_is_routed_from_the_start_vector_and_later_windows_from_the_past():
    model = _model()
    x = _tokens()
    y = x.clone()
    y[:, :R] = (y[:, :R] + 1) % 256                         # change window 0 only
    with trace(model, ["*.chapter_weights"]) as tx:
        model(x)
    with trace(model, ["*.chapter_weights"]) as ty:
        model(y)
    wx, wy = tx[f"layer{MEM}.chapter_weights"], ty[f"layer{MEM}.chapter_weights"]
    assert torch.equal(wx[:, 0], wy[:, 0])                 # window 0: the start vector only
    assert (wx[:, 1:] - wy[:, 1:]).abs().max() > 1e-9      # later windows see window 0


# --- M7: causality ----------------------------------------------------------------------------

def test_m7_block_causal_routing_is_causal_at_window_boundaries():
    model = _model()
    check_causal(model, _tokens(), positions=[0, R - 1, R, 2 * R - 1, 2 * R, T // 2 + 3, T - 2],
                 atol=1e-10)


def test_m7_sequence_routing_leaks_the_future_as_published():
    model = _model(routing="sequence")
    x = _tokens()
    y = x.clone()
    y[:, T // 2:] = (y[:, T // 2:] + 7) % 256
    moved = (model(y).logits - model(x).logits)[:, :T // 2].abs().max()
    assert moved > 1e-6, "earlier logits must move: the route pools the whole sequence"
    with pytest.raises(CheckFailed, match="causality"):
        check_causal(model, x, atol=1e-10)


def test_sequence_routing_with_zero_w_o_is_still_causal():
    check_causal(_model(wo_std=0, routing="sequence"), _tokens(), atol=1e-10)


# --- M9: cached generation ----------------------------------------------------------------

@pytest.mark.parametrize("prompt_len", [1, 5, R, 13])
def test_m9_cached_decode_equals_the_full_forward(prompt_len):
    model = _model()
    x = _tokens()
    full = model(x).logits
    with torch.no_grad():
        logits, state = model.prefill(x[:, :prompt_len], max_len=T)
        steps = [model.step(x[:, t], state)[0] for t in range(prompt_len, T)]
    assert torch.allclose(logits, full[:, :prompt_len], atol=1e-10)
    assert torch.allclose(torch.stack(steps, dim=1), full[:, prompt_len:], atol=1e-10)


def test_m9_greedy_generation_matches_the_full_forward_over_window_boundaries():
    model = _model()
    prompt = _tokens(length=5)
    out = model.generate(prompt, max_new_tokens=T - 5, greedy=True)       # crosses 8, 16, 24
    predicted = model(out[:, :-1]).logits.argmax(-1)
    assert torch.equal(out[:, 5:], predicted[:, 4:])


def test_sequence_routing_generation_keeps_the_prompt_route():
    model = _model(routing="sequence")
    x = _tokens()
    with torch.no_grad():
        logits, state = model.prefill(x[:, :12], max_len=T)
        route = state.memory[MEM].chapter_ids.clone()
        steps = torch.stack([model.step(x[:, t], state)[0] for t in range(12, T)], dim=1)
    assert torch.allclose(logits, model(x[:, :12]).logits, atol=1e-10)
    assert torch.equal(state.memory[MEM].chapter_ids, route)
    # the full forward routes from all 32 tokens: not what generation can know
    assert (steps - model(x).logits[:, 12:]).abs().max() > 1e-6


def test_state_bytes_are_the_caches_plus_the_running_sum_and_route():
    model = _model()
    batch, max_len, d, k = 2, T, 32, model.cfg.top_k
    with torch.no_grad():
        _, state = model.prefill(_tokens(length=13), max_len=max_len)
    caches = 2 * model.cfg.n_layer * batch * max_len * d * 8              # fp64 K and V
    n_read = (k + 1) * model.cfg.chapter_len
    memory = batch * d * 8 + 2 * batch * (k + 1) * 8 + 2 * batch * n_read * d * 8
    assert state.nbytes() == caches + memory
    with torch.no_grad():
        for t in range(13, 20):
            model.step(_tokens(length=1, seed=t)[:, 0], state)
    assert state.nbytes() == caches + memory                               # constant memory part


# --- trace -----------------------------------------------------------------------------------

def test_trace_records_router_probs_chapters_weights_and_attention_mass():
    model = _model()
    with trace(model) as t:
        model(_tokens())
    c, k = model.cfg.n_chapters, model.cfg.top_k
    probs = t[f"layer{MEM}.router_probs"]
    assert probs.shape == (2, T // R, c)
    assert torch.allclose(probs.sum(-1), torch.ones(2, T // R, dtype=torch.float64))
    assert t[f"layer{MEM}.chapters"].shape == (2, T // R, k + 1)
    assert t[f"layer{MEM}.chapter_weights"].shape == (2, T // R, k + 1)
    mass = t[f"layer{MEM}.chapter_attention"]
    assert mass.shape == (2, T, k + 1)
    assert torch.allclose(mass.sum(-1), torch.ones(2, T, dtype=torch.float64))


def test_reference_path_equals_the_fast_path():
    model = _model()
    x = _tokens(length=T - 3)                              # a partial last window
    assert torch.allclose(model(x).logits, model(x, reference=True).logits, atol=1e-10)


# --- config -----------------------------------------------------------------------------------

def test_default_memory_layers_follow_the_paper_pattern():
    assert default_memory_layers(16) == (2, 6, 10, 14)
    assert default_memory_layers(8) == (2, 6)
    assert default_memory_layers(4) == (2,)
    assert default_memory_layers(2) == (1,)
    assert default_memory_layers(1) == (0,)
    model = build_model(preset("tiny", arch="moc", n_layer=3, memory_layers=(0, 2)))
    assert model.memory_layers == (0, 2)
    assert [type(b).__name__ for b in model.blocks] == ["MoCBlock", "Block", "MoCBlock"]


@pytest.mark.parametrize("field, value, message", [
    ("top_k", 17, r"top_k=17 is not allowed: expected 1 <= top_k <= n_chapters - 1 = 16"),
    ("chapter_len", 0, r"chapter_len=0 is not allowed: expected an integer >= 1"),
    ("n_chapters", 1, r"n_chapters=1 is not allowed"),
    ("routing", "token", r"routing='token' is not allowed: expected one of block_causal, sequence"),
    ("routing_window", 0, r"routing_window=0 is not allowed"),
    ("memory_layers", (2,), r"memory_layers=\(2,\) is not allowed: .*\[0, 1\] \(n_layer=2\)"),
    ("memory_layers", (1, 1), r"memory_layers=\(1, 1\) is not allowed: .*distinct"),
    ("memory_layers", (), r"memory_layers=\(\) is not allowed"),
    ("lb_coef", -1.0, r"lb_coef=-1.0 is not allowed"),
    ("freeze_bank", "yes", r"freeze_bank='yes' is not allowed: expected True or False"),
])
def test_bad_config_is_a_clear_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(arch="moc", n_layer=2, **{field: value})


def test_iso_flop_dense_config_matches_the_flops_to_the_nearest_layer():
    cfg = ModelConfig(arch="moc", d_model=64, n_layer=8, n_head=4, seq_len=256,
                      n_chapters=257, chapter_len=16, top_k=8)       # memory layers 2 and 6
    dense = metrics.iso_flop_dense_config(cfg)
    assert dense.arch == "dense" and dense.d_model == 64 and dense.seq_len == 256
    target = metrics.flops_per_token(cfg)

    def gap(n_layer):
        return abs(metrics.flops_per_token(dataclasses.replace(dense, n_layer=n_layer)) - target)

    assert dense.n_layer > cfg.n_layer
    assert gap(dense.n_layer) <= min(gap(dense.n_layer - 1), gap(dense.n_layer + 1))
    build_model(dense)                                       # a valid, buildable config


# --- the seam: training calls a memory block as block(x, positions, bank) -------------------

class _NarrowBlock(MoCBlock):
    """A stand-in with the narrowest forward a memory block may have (notebook 08's capstone)."""

    def forward(self, x, positions, bank):
        return super().forward(x, positions, bank)


def test_training_calls_a_memory_block_with_x_positions_and_bank_only():
    kit = _model(memory_layers=(0, 1))
    narrow = copy.deepcopy(kit)
    replaced = swap_modules(narrow, MoCBlock, lambda old: _NarrowBlock(narrow.cfg).double())
    assert replaced == 2 and all(type(narrow.blocks[i]) is _NarrowBlock for i in (0, 1))
    x = _tokens()
    y = torch.roll(x, -1, dims=1)
    ours, theirs = narrow(x, y), kit(x, y)
    assert torch.equal(ours.logits, theirs.logits) and torch.equal(ours.loss, theirs.loss)
    assert ours.extras.keys() == theirs.extras.keys()
    assert all(torch.equal(ours.extras[k], theirs.extras[k]) for k in ours.extras)
    with pytest.raises(TypeError):          # caches and the reference path need the kit's block
        narrow(x, reference=True)


def test_block_options_pass_only_what_is_in_use():
    cache, state = object(), object()
    assert _block_options(None, False, None) == {}
    assert _block_options(cache, False, None) == {"cache": cache}
    assert _block_options(None, True, state) == {"layer_state": state, "reference": True}
