"""ARMT: docs/PAPERS.md, Properties the tests check (a1-a7 below), plus reset, memory_layers,
BPTT options, errors."""

import math

import pytest
import torch

from blockmem_lite import ModelConfig, build_model, preset
from blockmem_lite.checkpoints import load_checkpoint_file
from blockmem_lite.checks import check_causal
from blockmem_lite.config import TrainConfig
from blockmem_lite.measure import bench, metrics
from blockmem_lite.mechanisms.armt import armt_decode_layer_flops
from blockmem_lite.models.armt import (
    ARMT,
    EPS,
    associative_read,
    associative_write,
    dpfp,
    novelty,
)
from blockmem_lite.models.base import IGNORE_INDEX
from blockmem_lite.ops import armt_memory
from blockmem_lite.trace import trace
from blockmem_lite.train import (
    Callback,
    Trainer,
    load_model,
    train_curriculum,
)

S, M, D_MEM = 8, 2, 4          # segment size, memory tokens, d_mem (key width 6 * 4 = 24)
T = 30                         # crosses 3 segment boundaries, not a multiple of S


def _model(randomise_values=True, **kw):
    settings = dict(segment_size=S, n_mem_tokens=M, d_mem=D_MEM, **kw)
    model = build_model(preset("tiny", arch="armt", **settings)).double().eval()
    if randomise_values:   # W_V = 0 at init would make every memory test pass vacuously
        for layer in model.memory.values():
            torch.nn.init.normal_(layer.w_v.weight, std=0.3)
    return model


def _tokens(t=T, batch=2):
    return torch.randint(0, 256, (batch, t))


# --- A1: write / read algebra ---------------------------------------------------------

def _key(u):
    return dpfp(torch.as_tensor(u, dtype=torch.float64).view(1, 1, -1))     # (1, 1, 24)


def test_dpfp_is_the_product_of_rolled_relu_features():
    u = torch.randn(3, 5, dtype=torch.float64)
    phi = dpfp(u, normalize=False)
    r = torch.cat([u.clamp(min=0), (-u).clamp(min=0)], -1)                  # (3, 10)
    by_hand = torch.stack([torch.stack([r[b, i] * r[b, (i - j) % 10]
                                        for j in (1, 2, 3) for i in range(10)])
                           for b in range(3)])
    assert phi.shape == (3, 30) and torch.allclose(phi, by_hand)
    normalized = dpfp(u)
    assert torch.all(normalized >= 0)
    assert torch.allclose(normalized.norm(dim=-1), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="nu=0"):
        dpfp(u, nu=0)


def test_a1_read_returns_the_written_value():
    k, v = _key([0.3, -1.0, 0.7, 0.2]), torch.randn(1, 1, 6, dtype=torch.float64)
    A, z = associative_write(None, None, k, v, torch.ones(1, 1))
    assert torch.allclose(associative_read(k, A, z), v / (1 + EPS), atol=1e-12)


def test_a1_writing_the_same_pair_again_changes_nothing():
    k, v = _key([0.3, -1.0, 0.7, 0.2]), torch.randn(1, 1, 6, dtype=torch.float64)
    A, z = associative_write(None, None, k, v, torch.ones(1, 1))
    assert novelty(k, z).item() == 0.0                                     # nothing new
    A2, z2 = associative_write(A, z, k, v, torch.ones(1, 1))
    assert torch.equal(z2, z)
    assert (A2 - A).abs().max() < 2 * EPS * v.abs().max()                  # v - v_bar = O(eps)
    # without the correction gamma = 1 and z keeps counting the same key
    _, z3 = associative_write(A, z, k, v, torch.ones(1, 1), correction=False)
    assert torch.allclose(z3, 2 * z)


def test_a1_overwrite_replaces_the_value():
    k = _key([0.3, -1.0, 0.7, 0.2])
    v, v_new = torch.randn(2, 1, 1, 6, dtype=torch.float64)
    A, z = associative_write(None, None, k, v, torch.ones(1, 1))
    A, z = associative_write(A, z, k, v_new, torch.ones(1, 1))
    assert torch.allclose(associative_read(k, A, z), v_new, atol=1e-4)
    assert not torch.allclose(associative_read(k, A, z), v, atol=1e-1)


def test_a1_orthogonal_keys_are_retrieved_independently():
    u = torch.tensor([0.5, 1.0, 0.8, 0.3], dtype=torch.float64)
    k1, k2 = _key(u), _key(-u)           # positive u: features on disjoint halves
    assert (k1 * k2).sum() == 0
    keys = torch.cat([k1, k2], dim=1)                                      # (1, 2, 24)
    values = torch.randn(1, 2, 6, dtype=torch.float64)
    A, z = associative_write(None, None, keys, values, torch.ones(1, 2))   # in parallel
    assert torch.allclose(associative_read(keys, A, z), values / (1 + EPS), atol=1e-12)


def test_gamma_is_under_stop_gradient():
    z = dpfp(torch.randn(1, 3, 4, dtype=torch.float64)).sum(1)             # (1, 24)
    A = torch.randn(1, 24, 6, dtype=torch.float64)
    k = dpfp(torch.randn(1, 2, 4, dtype=torch.float64)).requires_grad_()
    v = torch.randn(1, 2, 6, dtype=torch.float64)
    gamma = novelty(k, z)
    assert 0 < gamma.min() and gamma.max() < 1 and not gamma.requires_grad
    _, z_new = associative_write(A, z, k, v, torch.ones(1, 2))
    z_new.sum().backward()       # z_new = z + sum_i gamma_i k_i: d/dk = gamma when gamma is constant
    assert torch.allclose(k.grad, gamma[..., None].expand_as(k))


# --- ops.armt_memory: each fused form equals its plain form, forward and gradients -------

def _value_and_grads(fn, inputs):
    """fn(*inputs) (a tuple) and the input gradients of a fixed random projection of it."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    outputs = fn(*inputs)
    gen = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outputs)
    return outputs, torch.autograd.grad(loss, inputs)


def _assert_same(plain, fused):
    """Equal outputs and gradients (fp64, 1e-12)."""
    (p_out, p_grads), (f_out, f_grads) = plain, fused
    for p, f in zip([*p_out, *p_grads], [*f_out, *f_grads], strict=True):
        assert torch.allclose(p, f, atol=1e-12, rtol=0)


@pytest.mark.parametrize("normalize", [True, False])
def test_signed_dpfp_equals_dpfp_forward_and_gradients(normalize):
    u = torch.randn(2, 5, 4, dtype=torch.float64)
    index = armt_memory.dpfp_roll_index(8)
    plain = _value_and_grads(lambda u: (dpfp(u, normalize=normalize),), [u])
    fused = _value_and_grads(
        lambda u: (armt_memory.signed_dpfp(torch.cat([u, -u], -1), index, normalize),), [u])
    assert torch.equal(plain[0][0], fused[0][0])                  # bit-identical features
    _assert_same(plain, fused)


def test_fused_read_equals_the_plain_read_forward_and_gradients():
    q = dpfp(torch.randn(2, 5, 4, dtype=torch.float64))
    A, z = torch.randn(2, 24, 6, dtype=torch.float64), torch.rand(2, 24, dtype=torch.float64)
    plain = _value_and_grads(lambda q, A, z: (associative_read(q, A, z),), [q, A, z])
    fused = _value_and_grads(
        lambda q, A, z: (armt_memory.fused_read(q, torch.cat([A, z[..., None]], -1)),), [q, A, z])
    _assert_same(plain, fused)


@pytest.mark.parametrize("empty", [True, False])
@pytest.mark.parametrize("correction, normalized", [(True, True), (False, True), (True, False)])
def test_fused_write_equals_the_plain_write_forward_and_gradients(empty, correction, normalized):
    k = dpfp(torch.randn(2, 3, 4, dtype=torch.float64), normalize=normalized)   # (B, M, K)
    v, beta = torch.randn(2, 3, 6, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64)
    memory = [] if empty else [torch.randn(2, 24, 6, dtype=torch.float64),
                               dpfp(torch.randn(2, 4, 4, dtype=torch.float64)).sum(1)]
    settings = dict(correction=correction, normalized=normalized)

    def plain(k, v, beta, A=None, z=None):
        return associative_write(A, z, k, v, beta, **settings)

    def fused(k, v, beta, A=None, z=None):
        return armt_memory.fused_write(A, z, k, v, beta, **settings)[:2]

    _assert_same(_value_and_grads(plain, [k, v, beta, *memory]),
                 _value_and_grads(fused, [k, v, beta, *memory]))


# --- A2: one segment is the backbone ----------------------------------------------------

@pytest.mark.parametrize("t", [S - 3, S])
def test_a2_single_segment_equals_the_backbone(t):
    model = _model()
    x = _tokens(t)
    assert torch.equal(model(x).logits, model.backbone(x).logits)


def test_wrap_keeps_the_pretrained_weights():
    dense = build_model(preset("tiny")).double().eval()
    x = _tokens(S)
    expected = dense(x).logits
    model = ARMT.wrap(dense, segment_size=S, n_mem_tokens=M, d_mem=D_MEM)
    assert model.backbone is dense and model.cfg.arch == "armt" and model.cfg.backbone == "dense"
    assert torch.equal(model(x).logits, expected)
    restored = build_model(model.cfg).double()
    restored.load_state_dict(model.state_dict())     # the same parameter names as build_model's
    assert torch.equal(restored.eval()(x).logits, expected)


def test_positions_restart_at_zero_in_every_segment(monkeypatch):
    model = _model()
    block = model.backbone.blocks[0]
    seen = []

    def spy(x, positions, cache=None):
        seen.append(positions.tolist())
        return type(block).forward(block, x, positions, cache)

    monkeypatch.setattr(block, "forward", spy)
    model(_tokens())
    assert seen == [list(range(S + M))] * 3 + [list(range(T % S))]   # memory tokens at n..n+M-1


def test_without_memory_layers_segments_are_independent():
    model = _model(memory_layers=())
    x = _tokens()
    per_segment = torch.cat([model.backbone(x[:, i:i + S]).logits for i in range(0, T, S)], 1)
    assert torch.allclose(model(x).logits, per_segment, atol=1e-12)


# --- A4: causality, and the memory carries information ----------------------------------

def test_a4_causal_across_and_inside_segments():
    model = _model()
    check_causal(model, _tokens(), positions=[0, S - 2, S - 1, S, 2 * S - 1, 2 * S + 3, T - 2],
                 atol=1e-9)


def test_memory_carries_segment_one_into_later_segments_only_once_w_v_learns():
    x = _tokens()
    y = x.clone()
    y[:, :S] = torch.randint(0, 256, (2, S))        # change segment 1 only
    trained, fresh = _model(), _model(randomise_values=False)
    assert (trained(y).logits - trained(x).logits)[:, S:].abs().max() > 1e-3
    assert torch.equal(fresh(y).logits[:, S:], fresh(x).logits[:, S:])     # W_V = 0: no memory


def test_a7_no_grad_decoding_with_the_prepared_read_equals_full_forward():
    model = _model()
    x = _tokens()
    with torch.no_grad():
        full = model(x).logits
        logits, state = model.prefill(x[:, :S + 1])
        pieces = [logits]
        for t in range(S + 1, T):
            step_logits, state = model.step(x[:, t], state)
            pieces.append(step_logits[:, None])
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    prepared = state.prepared[0]
    assert prepared.memory is state.memory[0]                      # A, z are views of [A | z]
    assert state.memory[0][0].untyped_storage().data_ptr() == prepared.az.untyped_storage().data_ptr()


def test_prepared_read_equals_read_and_its_features_equal_dpfp():
    layer = _model().memory_layer(0)
    A = torch.randn(2, 6 * D_MEM, 32, dtype=torch.float64)
    z = torch.rand(2, 6 * D_MEM, dtype=torch.float64)
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    with trace() as fast:
        got = layer.read_prepared(h, layer.prepare_read((A, z)))
    with trace() as plain:
        expected = layer.read(h, (A, z))
    assert torch.allclose(got, expected, atol=1e-12)
    assert torch.equal(fast["read_query"], plain["read_query"])   # the same DPFP features


# --- A5: constant state ---------------------------------------------------------------

def test_a5_state_size_does_not_grow_with_segments():
    model = _model()
    _, short = model.prefill(_tokens(2 * S + 3, batch=1))
    _, long = model.prefill(_tokens(9 * S + 3, batch=1))
    assert short.nbytes() == long.nbytes()
    for a, b in zip(short.memory, long.memory, strict=True):
        assert a[0].shape == b[0].shape == (1, 6 * D_MEM, 32) and a[1].shape == (1, 6 * D_MEM)
    assert all(c.capacity == S + M for c in long.caches)
    assert model.memory_layer(0).key_dim == 6 * D_MEM
    per_layer = 2 * (S + M) * 32 + 6 * D_MEM * 32 + 6 * D_MEM              # KV + A + z
    assert long.nbytes() == model.cfg.n_layer * per_layer * 8                # fp64


# --- A6: gradient flow ----------------------------------------------------------------

def _segment_two_loss_grads(model):
    model.train()
    x = _tokens(2 * S)
    targets = torch.roll(x, -1, dims=1)
    targets[:, :S] = IGNORE_INDEX                  # the loss sees segment 2's logits only
    model(x, targets).loss.backward()
    layer = model.memory_layer(0)
    return {"W_K": layer.w_k.weight.grad, "W_V": layer.w_v.weight.grad,
            "w_beta": layer.w_beta.weight.grad, "W_Q": layer.w_q.weight.grad,
            "P": model.memory_tokens.grad}


def test_a6_memory_path_gets_gradients_through_segment_one_writes():
    grads = _segment_two_loss_grads(_model())
    for name, grad in grads.items():
        assert grad is not None and grad.abs().max() > 0, name


def test_a6_at_true_init_only_w_v_gets_a_memory_gradient():
    grads = _segment_two_loss_grads(_model(randomise_values=False))
    assert grads.pop("W_V").abs().max() > 0        # A = 0 blocks every other path
    for name, grad in grads.items():
        assert grad is None or grad.abs().max() == 0, name


# --- A7: cached decoding ----------------------------------------------------------------

@pytest.mark.parametrize("prompt_len", [1, S - 1, S, 2 * S + 3])
def test_a7_cached_decode_equals_full_forward(prompt_len):
    model = _model()
    x = _tokens()
    full = model(x).logits
    logits, state = model.prefill(x[:, :prompt_len])
    pieces = [logits]
    for t in range(prompt_len, T):
        step_logits, state = model.step(x[:, t], state)
        pieces.append(step_logits[:, None])
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    assert state.position == T and state.caches[0].length == T % S


def test_a7_greedy_generation_matches_full_forward_argmax():
    model = _model()
    out = model.generate(_tokens(5, batch=1), 3 * S, greedy=True)          # 2+ boundaries
    full = model(out[:, :-1]).logits
    assert torch.equal(full[:, 4:].argmax(-1), out[:, 5:])


# --- reset, memory_layers, BPTT options -------------------------------------------------

def test_memory_is_reset_for_every_batch():
    model = _model()
    x, other = _tokens(), _tokens(batch=3)
    fresh = model(x).logits
    model(other)                                   # a different batch (and batch size) first
    assert torch.equal(model(x).logits, fresh)


def test_unwrapped_layers_neither_read_nor_write():
    full, subset = _model(), _model(memory_layers=(1,))
    assert list(subset.memory) == ["1"] and subset.memory_layer(0) is None
    subset.load_state_dict(full.state_dict(), strict=False)
    x = _tokens()
    assert not torch.allclose(subset(x).logits, full(x).logits, atol=1e-6)   # layer 0 mattered
    torch.nn.init.zeros_(full.memory_layer(0).w_v.weight)                   # silence layer 0
    assert torch.allclose(subset(x).logits, full(x).logits, atol=1e-12)
    with trace(subset, names=["*.read", "*.write_key"]) as t:
        subset(x)
    assert "segment1.layer1.read" in t and "segment0.layer1.write_key" in t
    assert not any(".layer0." in name for name in t.keys())


def _grads(model, x):
    model.train()
    model.zero_grad()
    out = model(x, torch.roll(x, -1, dims=1))
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


def _twins(**kw):
    """A default model and one with ``kw`` set, with the same weights."""
    plain, other = _model(), _model(**kw)
    other.load_state_dict(plain.state_dict())
    return plain, other


def test_detach_every_keeps_forward_values_and_truncates_gradients():
    x = _tokens(4 * S)
    full, cut = _twins(detach_every=2)
    full_logits, full_grads = _grads(full, x)
    cut_logits, cut_grads = _grads(cut, x)
    assert torch.allclose(cut_logits, full_logits, atol=1e-12)
    name = "memory.0.w_k.weight"
    assert not torch.allclose(cut_grads[name], full_grads[name], atol=1e-8)


def test_grad_checkpoint_gives_the_same_gradients():
    x = _tokens(3 * S)
    plain_model, checkpointed_model = _twins(grad_checkpoint=True)
    _, plain = _grads(plain_model, x)
    _, checkpointed = _grads(checkpointed_model, x)
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(plain_model.parameters()))
    for name, grad in plain.items():
        assert torch.allclose(checkpointed[name], grad, atol=1e-12), name


# --- trace ------------------------------------------------------------------------------

def test_trace_records_memory_per_segment_and_layer():
    model = _model()
    with trace(model) as t:
        model(_tokens(3 * S, batch=1))
    k = 6 * D_MEM
    assert t["segment0.layer1.A"].shape == (1, k, 32) and t["segment1.layer0.z"].shape == (1, k)
    assert t["segment0.layer0.write_key"].shape == (1, M, k)
    assert t["segment1.layer0.beta"].shape == t["segment1.layer0.gamma"].shape == (1, M)
    assert torch.all(t["segment0.layer0.gamma"] == 1)                      # first write
    assert t["segment1.layer0.read_query"].shape == (1, S + M, k)           # tokens + P read
    assert "segment0.layer0.read" not in t                                  # no read at s = 1
    assert "segment2.layer0.A" not in t                                     # the last one never writes


# --- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(segment_size=0), "segment_size=0"),
    (dict(segment_size=33), "segment_size=33.*seq_len=32"),
    (dict(n_mem_tokens=0), "n_mem_tokens=0.*memory tokens"),
    (dict(d_mem=0), "d_mem=0"),
    (dict(memory_layers=(0, 2)), r"memory_layers=\(0, 2\).*0\.\.1"),
    (dict(memory_layers=(1, 1)), "memory_layers=.*unique"),
    (dict(memory_layers=1), "memory_layers=1.*tuple"),
    (dict(detach_every=-1), "detach_every=-1"),
    (dict(detach_every=1), "detach_every=1.*never learn"),
    (dict(backbone="bcmt"), "backbone='bcmt'.*dense, hf"),
])
def test_bad_settings_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", arch="armt", **{"segment_size": S, **overrides})


def test_unsupported_backbones_are_clear_errors():
    with pytest.raises(ValueError, match="arch='bcmt'.*dense, hf"):
        ARMT.wrap(build_model(preset("tiny", arch="bcmt").model))
    with pytest.raises(ValueError, match="Linear.*embed"):
        ARMT.wrap(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="d_model=64.*width 32"):
        ARMT(preset("tiny", arch="armt", segment_size=S, d_model=64).model,
             build_model(preset("tiny").model))
    with pytest.raises(ValueError, match="backbone='hf'.*HFBackbone"):
        build_model(preset("tiny", arch="armt", segment_size=S, backbone="hf").model)
    with pytest.raises(ValueError, match="T=0"):
        _model()(torch.zeros(1, 0, dtype=torch.long))


# --- checkpoints and the curriculum -------------------------------------------------------

def _dataset(n, length):
    x = torch.randint(0, 256, (n, length + 1))
    return torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:])


def test_wrap_a_checkpoint_wraps_the_trained_dense_model(tmp_path):
    dense = build_model(preset("tiny").model)
    cfg = TrainConfig(steps=1, batch_size=2, warmup_steps=0, device="cpu")
    path = Trainer(dense, cfg, _dataset(4, 16), callbacks=[Callback()]).save_checkpoint(
        tmp_path / "dense.pt")
    model = ARMT.wrap(load_model(path), segment_size=S, n_mem_tokens=M, d_mem=D_MEM)
    x = _tokens(S)
    assert torch.equal(model.eval()(x).logits, dense.eval()(x).logits)
    with pytest.raises(ValueError, match="backbone of type ARMT is not allowed"):
        ARMT.wrap(load_model(Trainer(_model(), cfg, _dataset(4, 16), callbacks=[Callback()])
                             .save_checkpoint(tmp_path / "armt.pt")))


def test_curriculum_grows_segments_and_resumes_from_the_last_stage(tmp_path):
    model = build_model(preset("tiny", arch="armt", segment_size=S, n_mem_tokens=M,
                               d_mem=D_MEM).model)
    lengths = []

    def make_data(n_segments):
        lengths.append(n_segments * S)
        return _dataset(4, n_segments * S), _dataset(2, n_segments * S)

    before = model.memory_tokens.detach().clone()
    cfg = TrainConfig(batch_size=2, warmup_steps=0, eval_every=10, eval_batches=1, device="cpu")
    histories = train_curriculum(model, (1, 2), make_data=make_data, train_cfg=cfg,
                                 steps_per_stage=(2, 1), callbacks=[Callback()],
                                 checkpoint_dir=tmp_path)
    assert lengths == [S, 2 * S]
    assert [len(h.step) for h in histories] == [2, 1] and histories[1].val_loss
    assert not torch.equal(model.memory_tokens.detach(), before)
    for name in ("stage0_1seg", "stage1_2seg"):
        ckpt = load_checkpoint_file(tmp_path / name / "checkpoint.pt")
        assert ckpt["run_config"]["model"]["arch"] == "armt"
    last = load_checkpoint_file(tmp_path / "stage1_2seg" / "checkpoint.pt")["model"]
    assert torch.equal(last["memory_tokens"], model.memory_tokens.detach())
    with pytest.raises(ValueError, match="steps_per_stage"):
        train_curriculum(model, (1, 2), make_data=make_data, train_cfg=cfg, steps_per_stage=(1,))


# --- FLOP model and bench ----------------------------------------------------------------

def test_decode_flop_model_is_the_mean_of_the_per_step_counts():
    d, s, m, dm = 64, 16, 4, 8
    token_steps = [24 * d * d + 4 * d * (p + 1) + 14 * d * dm for p in range(s)]
    write_tokens = [24 * d * d + 4 * d * (s + j + 1) + 14 * d * dm + 2 * d * d + 26 * d * dm
                    for j in range(m)]
    mean = (sum(token_steps) + sum(write_tokens)) / s
    assert armt_decode_layer_flops(d, s, m, dm) == pytest.approx(mean)
    cfg = ModelConfig("armt", d_model=d, n_layer=2, n_head=2, seq_len=4096, segment_size=s,
                      n_mem_tokens=m, d_mem=dm)
    assert metrics.flops_per_token(cfg, decode=True) == pytest.approx(
        2 * mean + 2 * d * 256)


def test_bench_runs_armt_variants_with_ceilings():
    records = bench.run_bench(["armt"], [32], d_model=32, n_layer=1, n_head=2, batch=1,
                              threads=1, warmup=1, repeats=1, decode_burst=2,
                              memory=("none",), options={"segment_size": [8, 16], "infer_len": []},
                              progress=False)
    armt = [r for r in records if r["arch"] == "armt"]
    assert {(r["variant"], r["phase"]) for r in armt} == {
        (v, p) for v in ("S=8", "S=16") for p in ("train", "decode")}
    assert all(r["flop_ceiling"] is not None and r["flop_ceiling"] > 0 for r in armt)
    decode = {r["variant"]: r["state_bytes"] for r in armt if r["phase"] == "decode"}
    assert decode["S=8"] < decode["S=16"]                 # the cache holds one segment (+ P)
    assert math.isfinite(sum(r["tokens_per_s"] for r in armt))


@pytest.mark.parametrize("layers", [None, (1,)])
def test_a3_layer_major_loop_equals_the_segment_loop(layers):
    """A3: running layer by layer (each layer over all segments) gives the same logits."""
    model = _model(memory_layers=layers)
    x = torch.randint(0, 256, (2, 3 * S + 5))                        # a short last segment
    expected = model(x).logits
    assert torch.allclose(model.run_layer_major(x), expected, atol=1e-10)
    # teeth: the memory matters here, so a loop that dropped it would differ
    without = torch.cat([model(x[:, i:i + S]).logits for i in range(0, x.shape[1], S)], 1)
    assert (without - expected).abs().max() > 1e-6


class _ReadWriteOnly(torch.nn.Module):
    """A memory layer that is not an AssociativeMemoryLayer: the same parameters, read and write
    from the pure functions, nothing else (what notebook 06's capstone plugs in)."""

    def __init__(self, old):
        super().__init__()
        self.w_q, self.w_k, self.w_v, self.w_beta = old.w_q, old.w_k, old.w_v, old.w_beta
        self.eps = old.eps

    def read(self, h, memory):
        return associative_read(dpfp(self.w_q(h)), *memory, self.eps)

    def write(self, m, memory):
        k, beta = dpfp(self.w_k(m)), torch.sigmoid(self.w_beta(m))[..., 0]
        A, z = memory if memory is not None else (None, None)
        return associative_write(A, z, k, self.w_v(m), beta, eps=self.eps)


def test_the_model_uses_its_memory_layers_only_through_read_and_write():
    """The seam notebook 06's capstone relies on: any module with read(h, (A, z)) and
    write(m, memory or None) can stand in for an AssociativeMemoryLayer (swap_modules)."""
    from blockmem_lite.models.armt import AssociativeMemoryLayer
    from blockmem_lite.plugged_in import swap_modules

    model, x = _model(), _tokens()
    expected = model(x).logits
    _, state = model.prefill(x[:, :-1])
    expected_step = model.step(x[:, -1], state)[0]
    assert swap_modules(model, AssociativeMemoryLayer, _ReadWriteOnly) == len(model.memory) == 2
    assert not any(isinstance(m, AssociativeMemoryLayer) for m in model.modules())
    assert torch.allclose(model(x).logits, expected, atol=1e-10)
    _, state = model.prefill(x[:, :-1])
    assert torch.allclose(model.step(x[:, -1], state)[0], expected_step, atol=1e-10)
    assert torch.allclose(model.run_layer_major(x), expected, atol=1e-10)
