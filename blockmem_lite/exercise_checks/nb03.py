"""The checks of exercises/03_bcmt_training_vs_dense.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from blockmem_lite import mechanisms, tasks
from blockmem_lite.checks import check_close, check_equal, check_true
from blockmem_lite.config import ModelConfig
from blockmem_lite.corpora import corpus_windows, load_corpus
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.exercise_checks.plugged import capstone, check_capstone
from blockmem_lite.measure import flops, metrics
from blockmem_lite.models import bcmt, build_model
from blockmem_lite.models.bcmt import decay_weights
from blockmem_lite.own_work import check_prediction
from blockmem_lite.plugged_in import swap_modules
from blockmem_lite.runtime import seed_everything
from blockmem_lite.tokenizer import get_tokenizer

CAPSTONE = ModelConfig(arch="bcmt", d_model=32, n_layer=2, n_head=2, seq_len=64, block_size=16,
                       dropout=0.0)       # small in every preset: seconds


@exercise_check("nb03-10", own_work={"block_local_ceiling": (
    flops.flop_ceiling, flops.layer_matmul_flops, flops.dense_layer_flops, flops.lm_head_flops,
    metrics.flops_per_token, mechanisms.bcmt.flops_per_token,
    mechanisms.bcmt.block_local_layer_flops)})
def ceiling_check(t):
    """block_local_ceiling against the kit's FLOP model (dense / HOnly) on fixed settings and
    one drawn anew, and the backbone ceilings at d=256, L=128 that docs/MEASUREMENTS.md
    (#the-flop-model) gives."""
    block_local_ceiling = t.answer("block_local_ceiling")
    block = 8 * t.fresh_int(1, 32)
    settings = [(256, 4, 1024, 128, 256), (128, 6, 1024, 128, 50257), (32, 2, 64, 16, 256),
                (16 * t.fresh_int(1, 24), t.fresh_int(1, 12), block * t.fresh_int(2, 64), block,
                 t.fresh_int(2, 60000))]
    for d, n_layer, seq_len, block_size, vocab in settings:
        setting = dict(d_model=d, n_layer=n_layer, seq_len=seq_len, vocab_size=vocab)
        expected = flops.flop_ceiling(
            metrics.flops_per_token(ModelConfig(**setting)),
            metrics.flops_per_token(ModelConfig("honly", **setting, block_size=block_size)))
        check_close(block_local_ceiling(d, n_layer, seq_len, block_size, vocab), expected,
                    f"ceiling d={d}, layers={n_layer}, T={seq_len}, L={block_size}, V={vocab}")
    check_close([block_local_ceiling(256, 4, n, 128, 0) for n in (1024, 4096, 16384)],
                [1.28, 2.24, 6.08], "the kit's FLOP model at d=256, L=128: the backbone "
                "ceilings at T = 1024, 4096, 16384",
                atol=0.005, rtol=0.0)


MEMORY_OFF_HINT = ("the memory reaches a token only through V = U + G * P, with P = M W_p: "
                   "which weight makes P zero in every layer, whatever the gate G is? Every other "
                   "weight stays as it was, and the dict you were given is left unchanged")


def ablation_config(n_layer: int, arch: str = "bcmt") -> ModelConfig:
    """A small BCMT (or HOnly: ``arch="honly"``) with ``n_layer`` layers: seconds in every
    preset."""
    return ModelConfig(arch=arch, d_model=32, n_layer=n_layer, n_head=2, seq_len=64,
                       block_size=16, dropout=0.0)


def ablation_weights(n_layer: int, seed: int) -> dict:
    """The weights (state dict) of an ``ablation_config(n_layer)`` BCMT drawn from ``seed``,
    with random W_p and gate biases: a fresh BCMT has W_p = 0, which would hide a wrong
    answer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(ablation_config(n_layer))
        with torch.no_grad():
            for layer in model.blocks:
                nn.init.normal_(layer.memory_proj.weight, std=0.3)
                nn.init.normal_(layer.gate.bias, std=1.0)
    return {name: value.clone() for name, value in model.state_dict().items()}


def logits_with(weights: dict, arch: str, n_layer: int, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of the ``arch`` model ("bcmt" or "honly") of ``ablation_config(n_layer)``
    holding ``weights``; HOnly takes the weights it has and leaves the memory's."""
    model = build_model(ablation_config(n_layer, arch)).eval()
    missing, _ = model.load_state_dict(weights, strict=arch == "bcmt")
    if missing:
        raise ValueError(f"weights without {missing[0]!r} are not allowed: expected every "
                         f"weight of a {arch} model")
    with torch.no_grad():
        return model(tokens).logits


def _shapes(weights) -> dict:
    return {name: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            for name, v in weights.items()}


def memory_off_where_answered(t, n_layer: int, seed: int) -> tuple:
    """In the student's notebook: without_memory on ``ablation_weights(n_layer, seed)``; its
    result, and whether the dict it was given came back unchanged."""
    weights = ablation_weights(n_layer, seed)
    given = {name: value.clone() for name, value in weights.items()}
    off = t.answer("without_memory")(given)
    unchanged = set(given) == set(weights) and all(
        isinstance(given[name], torch.Tensor) and torch.equal(given[name], weights[name])
        for name in weights)
    return off, unchanged


@exercise_check("nb03-ablation-check")
def memory_off_check(t):
    """without_memory on the weights of small BCMTs (2 layers, and layers and weights drawn
    anew): the same names and shapes, the given dict unchanged, and a BCMT holding the result
    gives the logits HOnly gives with the original weights."""
    for n_layer, seed in [(2, 0), (t.fresh_int(1, 4), t.fresh_int(1, 2**31 - 1))]:
        weights, where = ablation_weights(n_layer, seed), f"{n_layer} layer(s), seed {seed}"
        off, unchanged = t.remote(memory_off_where_answered, n_layer, seed)
        check_true(isinstance(off, dict), f"without_memory returns a dict ({where})",
                   f"got {type(off).__name__}")
        check_equal(_shapes(off), _shapes(weights),
                    f"the names and shapes of the weights without_memory returns ({where})")
        check_true(unchanged, f"the weights given to without_memory are left unchanged ({where})",
                   "change a copy: a model's state_dict() shares its tensors with the model")
        tokens = torch.randint(0, 256, (2, 64), generator=t.fresh_generator())   # (B, T)
        check_prediction(logits_with(off, "bcmt", n_layer, tokens),
                         logits_with(weights, "honly", n_layer, tokens),
                         f"BCMT with your weights vs HOnly with the original ones ({where})",
                         hint=MEMORY_OFF_HINT)


def truth_from_rows(distance, seq_len, block_size, key_len):
    """Whether all key tokens and all answer positions of a passkey row share one block,
    answered from a generated ``tasks.passkey`` row's positions."""
    row = tasks.passkey(1, seq_len, distance, key_len=key_len, seed=distance)
    key_marker = int((row.inputs[0] == tasks.special_ids()["key"]).nonzero()[0])
    positions = list(range(key_marker + 1, key_marker + 1 + key_len))
    positions += row.meta["answer_positions"][0].tolist()
    return len({p // block_size for p in positions}) == 1


def answers_for_every_distance(t, seq_len: int, block_size: int, key_len: int) -> list:
    """In the student's notebook: key_in_query_block for every distance passkey allows."""
    key_in_query_block = t.answer("key_in_query_block")
    return [key_in_query_block(d, seq_len, block_size, key_len)
            for d in range(key_len + 1, seq_len - key_len + 1)]


@exercise_check("nb03-22", own_work={"key_in_query_block": (truth_from_rows, tasks.passkey)})
def key_block_check(t):
    """key_in_query_block for every distance against real passkey rows' positions, on fixed
    settings and one drawn anew (a length that need not be whole blocks)."""
    keys, size = t.fresh_int(1, 6), t.fresh_int(4, 40)
    drawn = (t.fresh_int(max(2 * keys + 1, size + 1), 4 * size), size, keys)
    for seq_len, block_size, key_len in [(64, 16, 5), (96, 32, 3), (256, 64, 5), drawn]:
        valid = range(key_len + 1, seq_len - key_len + 1)
        check_equal(t.remote(answers_for_every_distance, seq_len, block_size, key_len),
                    [truth_from_rows(d, seq_len, block_size, key_len) for d in valid],
                    f"key_in_query_block for every distance, T={seq_len}, L={block_size}, "
                    f"key_len={key_len}")


def capstone_batches(offset: int = 0) -> list:
    """8 (tokens, targets) batches of 8 windows of 64 bytes of the offline corpus's training
    windows: every 97th from ``offset`` on (the check draws the offset anew)."""
    windows, _ = corpus_windows(load_corpus("offline"), CAPSTONE.seq_len, 0.1,
                                get_tokenizer("bytes"))
    windows = windows[offset::97][:64].long()                       # (64, T + 1)
    return [(w[:, :-1], w[:, 1:]) for w in windows.view(8, 8, -1)]  # 8 steps of 8


def make_capstone_model() -> nn.Module:
    """A small BCMT LM, the same weights at every call. A fresh BCMT has W_p = 0 (it starts
    as HOnly): random W_p give the memory a voice, so a wrong memory path cannot pass."""
    seed_everything(0)
    model = build_model(CAPSTONE)
    with torch.no_grad():
        for layer in model.blocks:
            nn.init.normal_(layer.memory_proj.weight, std=0.3)
    return model


def plug_in(t, model: nn.Module) -> int:
    """Every bcmt.BCMTLayer of the model becomes a MyBCMTLayer holding the same weights."""
    layer_class = t.answer("MyBCMTLayer")
    return swap_modules(model, bcmt.BCMTLayer, lambda kit_layer: layer_class(model.cfg))


capstone("nb03-33", make_capstone_model, plug_in)


@exercise_check("nb03-33", own_work={"MyBCMTLayer": (
    bcmt.BCMTLayer, decay_weights, bcmt.memory_matrix_form, bcmt.memory_scan_form,
    bcmt.shift_one_block, bcmt.block_summaries)})
def bcmt_layer_check(t):
    """MyBCMTLayer inside the kit's BCMT LM: the same logits, causal, the same loss curve over
    8 training steps on windows drawn anew. Returns (the kit's curve, yours)."""
    return check_capstone(t, capstone_batches(offset=t.fresh_int(0, 96)),
                          "MyBCMTLayer in a BCMT LM")
