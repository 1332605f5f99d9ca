"""Each mechanism's readable ``reference_forward`` equals its fast forward (fp64, ~1e-10).

The zero-initialised memory outputs (BCMT W_p, ARMT W_V, MoC W_O) are
re-randomised, or the memory paths would be invisible. Lengths cross the
block / segment / chunk / window boundaries and include one that is not a
multiple of them. Each mechanism also has a planted mistake in its fast path
that the same comparison catches (the test has teeth).
"""

import pytest
import torch
import torch.nn.functional as F

from blockmem_lite import build_model, preset
from blockmem_lite.models import armt, armt_reference, bcmt, cat, moc
from blockmem_lite.ops import armt_memory

TOL = 1e-10
LENGTHS = (32, 29, 5)      # whole blocks, a ragged tail, less than one block / segment / chunk


def _tokens(t, batch=2):
    return torch.randint(0, 256, (batch, t), generator=torch.Generator().manual_seed(t))


def _gap(model, reference, x, **kw) -> float:
    return (reference(model, x, **kw) - model(x, **kw).logits).abs().max().item()


# --- BCMT / HOnly ------------------------------------------------------------------------

def _bcmt(arch="bcmt", **kw):
    model = build_model(preset("tiny", arch=arch, block_size=8, **kw)).double().eval()
    for layer in model.blocks:
        if layer.has_memory:                                   # W_p = 0 at init
            torch.nn.init.normal_(layer.memory_proj.weight, std=0.3)
    return model


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("arch, kw", [("bcmt", {}), ("bcmt", {"alpha": 0.3}),
                                      ("bcmt", {"memory": False}), ("honly", {})])
def test_bcmt_reference_equals_fast_forward(arch, kw, t):
    assert _gap(_bcmt(arch, **kw), bcmt.reference_forward, _tokens(t)) < TOL


def _with_weights_of(model, cls):
    """A ``cls`` (a subclass planting a bug) with ``model``'s config and weights."""
    planted = cls(model.cfg).double().eval()
    planted.load_state_dict(model.state_dict())
    return planted


def test_bcmt_reference_catches_a_missing_one_block_shift():
    class NoShift(bcmt.BCMTLM):
        shift = staticmethod(lambda memories: memories)                     # block i reads M_i

    model, x = _bcmt(), _tokens(29)
    assert _gap(_with_weights_of(model, NoShift), bcmt.reference_forward, x) > 1e-3


def test_bcmt_reference_catches_a_wrong_gate_split(monkeypatch):
    model, x = _bcmt(), _tokens(29)

    def swapped_fuse(self, u, p):                              # W_g's U and P halves swapped
        w_p, w_u = self.gate.weight.split(u.shape[-1], dim=1)
        g = torch.sigmoid(F.linear(u, w_u) + F.linear(p, w_p, self.gate.bias)[:, :, None])
        return u + g * p[:, :, None]

    monkeypatch.setattr(bcmt.BCMTLayer, "fuse", swapped_fuse)
    assert _gap(model, bcmt.reference_forward, x) > 1e-3


# --- CAT ---------------------------------------------------------------------------------

def _cat(chunk_sizes=()):
    cfg = preset("tiny", arch="cat", chunk_size=4, chunk_sizes=chunk_sizes)
    return build_model(cfg).double().eval()


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("chunk_sizes", [(), (2, 4, 8)])
def test_cat_reference_equals_fast_forward(chunk_sizes, t):
    model, x = _cat(chunk_sizes), _tokens(t)
    for c in model.chunk_sizes:
        assert _gap(model, cat.reference_forward, x, chunk_size=c) < TOL


def test_cat_reference_catches_a_readout_off_by_one():
    class LateReadout(cat.CATLM):                              # one slot too late
        readout_slots = staticmethod(
            lambda k, c, sep=False, device=None: cat.CATLM.readout_slots(k, c, sep, device) + 1)

    model, x = _cat(), _tokens(29)
    assert _gap(_with_weights_of(model, LateReadout), cat.reference_forward, x) > 1e-3


# --- ARMT --------------------------------------------------------------------------------

def _armt(key_std=None, **kw):
    """fp64 ARMT, W_V re-randomised; ``key_std`` also re-randomises W_Q, W_K (larger keys)."""
    cfg = preset("tiny", arch="armt", segment_size=8, n_mem_tokens=2, d_mem=4, **kw)
    model = build_model(cfg).double().eval()
    for layer in model.memory.values():                        # W_V = 0 at init
        torch.nn.init.normal_(layer.w_v.weight, std=0.3)
        if key_std:
            torch.nn.init.normal_(layer.w_q.weight, std=key_std)
            torch.nn.init.normal_(layer.w_k.weight, std=key_std)
    return model


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("kw", [{}, {"normalize_phi": False},
                                {"normalize_phi": False, "key_std": 0.5},
                                {"correction": False}, {"memory_layers": (1,)}])
def test_armt_reference_equals_fast_forward(kw, t):
    assert _gap(_armt(**kw), armt_reference.reference_forward, _tokens(t)) < TOL


def test_armt_reference_catches_gamma_without_the_correction(monkeypatch):
    model, x = _armt(), _tokens(29)
    monkeypatch.setattr(armt_memory, "_novelty_of", lambda seen, k_phi, eps, normalized:
                        torch.ones_like(seen))                 # z counts every key again
    assert _gap(model, armt_reference.reference_forward, x) > 1e-3


def test_armt_2024_mode_needs_the_eps_in_the_key_norm(monkeypatch):
    """normalize_phi=False with the newer code's gamma (no eps in |k|^2) moves logits.

    Raw DPFP keys of W_K ~ N(0, 0.5) have |k|^2 near eps, where the two forms part.
    """
    model, x = _armt(key_std=0.5, normalize_phi=False), _tokens(29)
    original = armt_memory._novelty_of                         # the fast path's gamma
    monkeypatch.setattr(armt_memory, "_novelty_of", lambda seen, k_phi, eps, normalized:
                        original(seen, k_phi, eps, normalized=True))
    assert _gap(model, armt_reference.reference_forward, x) > 1e-6


def test_novelty_forms_match_a_hand_computation():
    eps = armt.EPS
    small = torch.tensor([[[0.003, 0.004]]], dtype=torch.float64)   # |k|^2 = 2.5e-5
    unit = torch.tensor([[[0.6, 0.8]]], dtype=torch.float64)        # |k|^2 = 1
    z_small = torch.tensor([[0.001, 0.0]], dtype=torch.float64)     # k . z = 3e-6
    z_unit = torch.tensor([[0.5, 0.0]], dtype=torch.float64)        # k . z = 0.3
    newer = armt.novelty(small, z_small).item()
    paper = armt.novelty(small, z_small, normalized=False).item()
    assert newer == pytest.approx(1 - (3e-6 + eps) / 2.5e-5, abs=1e-12)           # 0.48
    assert paper == pytest.approx(1 - (3e-6 + eps) / (2.5e-5 + eps), abs=1e-12)   # 0.6286
    assert paper - newer > 0.1                                 # small keys: the eps matters
    newer = armt.novelty(unit, z_unit).item()
    paper = armt.novelty(unit, z_unit, normalized=False).item()
    assert newer == pytest.approx(1 - (0.3 + eps), abs=1e-12)
    assert paper == pytest.approx(1 - (0.3 + eps) / (1 + eps), abs=1e-12)
    assert abs(paper - newer) < 1e-5                           # unit keys: the forms agree


# --- MoC ---------------------------------------------------------------------------------

def _moc(**kw):
    model = build_model(preset("tiny", arch="moc", routing_window=8, **kw)).double().eval()
    for i in model.memory_layers:                              # W_O = 0 at init
        torch.nn.init.normal_(model.blocks[i].memory.out.weight, std=0.3)
    return model


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("routing", ["block_causal", "sequence"])
def test_moc_reference_equals_fast_forward(routing, t):
    assert _gap(_moc(routing=routing), moc.reference_forward, _tokens(t)) < TOL


def test_moc_reference_catches_unweighted_chapters(monkeypatch):
    model, x = _moc(), _tokens(29)
    monkeypatch.setattr(moc, "token_weights", lambda weights, chapter_len: torch.ones_like(
        weights.repeat_interleave(chapter_len, dim=-1)[..., None]))
    assert _gap(model, moc.reference_forward, x) > 1e-3
