"""The checks of exercises/06_armt_associative_memory.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from blockmem_lite.checks import check_close, check_equal, check_shape
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.exercise_checks.plugged import capstone, check_capstone
from blockmem_lite.models import armt, build_model
from blockmem_lite.own_work import check_gradients, check_prediction
from blockmem_lite.plugged_in import swap_modules

CAPSTONE = ModelConfig(arch="armt", d_model=48, n_layer=2, n_head=2, seq_len=64, segment_size=8,
                       n_mem_tokens=4, d_mem=8)


def read(q_phi, A, z, eps=armt.EPS):
    """(q A) / (q . z + eps), as the notebook's my_read. (..., T, K), (..., K, D), (..., K)."""
    return (q_phi @ A) / (q_phi @ z[..., None] + eps)


@exercise_check("nb06-05", own_work={"my_dpfp": (armt.dpfp,)})
def dpfp_check(t):
    """my_dpfp's shape and dtype, against armt.dpfp for each nu, and orthonormal quadrants."""
    my_dpfp = t.answer("my_dpfp")
    d = t.fresh_int(3, 6)
    u = torch.randn(2, 5, d, dtype=torch.float64, generator=t.fresh_generator())
    check_shape(my_dpfp(u), (2, 5, 6 * d), f"my_dpfp(u) for d = {d}, nu = 3")
    check_equal(my_dpfp(u).dtype, torch.float64, "my_dpfp of float64 keys: the dtype of the "
                "features")
    for nu in (1, 2, 3):
        for normalize in (False, True):
            check_close(my_dpfp(u, nu, normalize), armt.dpfp(u, nu, normalize),
                        f"my_dpfp vs armt.dpfp, nu={nu}, normalize={normalize}", atol=1e-12)
    quadrants = my_dpfp(torch.tensor([[1.0, 0.5], [-0.8, -1.2], [0.9, -0.7], [-0.6, 1.1]],
                                     dtype=torch.float64))
    check_close(quadrants @ quadrants.T, torch.eye(4, dtype=torch.float64),
                "d = 2: keys from the four sign quadrants are orthonormal", atol=1e-12)


def _flat(x):
    return None if x is None else x.flatten(0, 1)                  # (B, H, ...) -> (B H, ...)


@exercise_check("nb06-09", own_work={"my_write_heads": (
    armt.associative_write, armt.associative_read, armt.novelty)})
def write_heads_check(t):
    """my_write_heads against armt.associative_write per head, its gradients (gamma carries
    none), and what a memory written by it reads back."""
    my_write_heads = t.answer("my_write_heads")
    B, H, M, D_H = 2, 2, t.fresh_int(2, 4), 6
    gen = t.fresh_generator()
    old_A = torch.randn(B, H, 24, D_H, generator=gen, dtype=torch.float64)
    old_z = armt.dpfp(torch.randn(B, H, 3, 4, generator=gen, dtype=torch.float64)).sum(2)
    raw = torch.randn(B, H, M, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, M, D_H, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, H, M, generator=gen, dtype=torch.float64)
    for normalize in (True, False):
        k = armt.dpfp(raw, normalize=normalize)
        for A, z, correction in ((old_A, old_z, True), (old_A, old_z, False), (None, None, True)):
            kit_A, kit_z = armt.associative_write(_flat(A), _flat(z), _flat(k), _flat(v),
                                                  _flat(beta), correction)
            mine_A, mine_z = my_write_heads(A, z, k, v, beta, correction)
            label = (f"{'empty' if A is None else 'stored'} memory, correction={correction}, "
                     f"unit keys={normalize}")
            check_close(mine_A, kit_A.view(B, H, 24, D_H), f"A, {label}", atol=1e-12)
            check_close(mine_z, kit_z.view(B, H, 24), f"z, {label}", atol=1e-12)

    def kit_heads(A, z, k, v, b):
        return tuple(new.view_as(old) for new, old in zip(
            armt.associative_write(_flat(A), _flat(z), _flat(k), _flat(v), _flat(b)), (A, z),
            strict=True))

    check_gradients(my_write_heads, kit_heads, (old_A, old_z, k, v, beta),
                    "my_write_heads, stored memory", names=("A", "z", "k_phi", "v", "beta"))
    _reads_back(my_write_heads, gen)


def _reads_back(my_write_heads, gen: torch.Generator) -> None:
    """A memory written by ``my_write_heads``: each head recalls, rewrites, overwrites."""
    one = torch.ones(1, 2, 1, dtype=torch.float64)                       # beta = 1, 2 heads
    keys = armt.dpfp(torch.tensor([[[[0.3, -1.0, 0.7, 0.2]], [[-0.5, 0.4, 1.1, -0.9]]]],
                                  dtype=torch.float64))
    value, new_value = torch.randn(2, 1, 2, 1, 6, generator=gen, dtype=torch.float64)
    A1, z1 = my_write_heads(None, None, keys, value, one)
    check_close(read(keys, A1, z1), value, "each head reads back the value written to it",
                atol=1e-4)
    A2, z2 = my_write_heads(A1, z1, keys, value, one)
    check_equal(z2, z1, "writing the same pairs again leaves z unchanged")
    check_close(A2, A1, "writing the same pairs again leaves A unchanged", atol=1e-4)
    A3, z3 = my_write_heads(A1, z1, keys, new_value, one)
    check_close(read(keys, A3, z3), new_value, "overwrite: each head reads back its new value",
                atol=1e-4)
    u_pos = torch.tensor([0.5, 1.0, 0.8, 0.3], dtype=torch.float64)
    both = armt.dpfp(torch.stack([u_pos, -u_pos])).expand(1, 2, 2, 24)  # orthogonal, both heads
    pair_values = torch.randn(1, 2, 2, 6, generator=gen, dtype=torch.float64)
    A4, z4 = my_write_heads(None, None, both, pair_values, torch.ones(1, 2, 2, dtype=torch.float64))
    check_close(read(both, A4, z4), pair_values,
                "two orthogonal keys written in parallel are both recalled", atol=1e-4)


def write_repeatedly(n: int, correction: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The read of one unit key as a fraction of its value (mean over the non-zero entries),
    and k . z, after writing the same pair ``n`` times with the kit's write."""
    k_rep = armt.dpfp(torch.tensor([[[0.9, 0.4, -1.1, 0.6]]], dtype=torch.float64))  # (1, 1, 24)
    v_rep = torch.tensor([[[1.0, -2.0, 0.5, 3.0, 0.0, -1.0]]], dtype=torch.float64)
    full = torch.ones(1, 1, dtype=torch.float64)
    A_, z_ = None, None
    for _ in range(n):
        A_, z_ = armt.associative_write(A_, z_, k_rep, v_rep, full, correction=correction)
    nonzero = v_rep != 0
    return ((read(k_rep, A_, z_) / v_rep)[nonzero]).mean(), (k_rep[:, 0] * z_).sum()


@exercise_check("nb06-14")
def repeated_writes_check(t):
    """The four predicted values of writing one pair again and again, without the read
    values ever shown."""
    measured = {n: write_repeatedly(n, correction=False) for n in (1, 2, 4)}
    corrected = write_repeatedly(4, correction=True)
    check_prediction(t.value("fraction_after_2"), measured[2][0],
                     "read after 2 writes, no correction",
                     hint="a and c are both 1 after the first write: what does the second add "
                          "to each?", atol=1e-3)
    check_prediction(t.value("fraction_after_4"), measured[4][0],
                     "read after 4 writes, no correction",
                     hint="is there a read that one more write leaves unchanged?", atol=1e-3)
    check_prediction(t.value("z_growth_after_4"), measured[4][1] / measured[1][1],
                     "k.z growth over 4 writes, no correction",
                     hint="without the correction, how much of phi(k) does z gain at each "
                          "write?", atol=1e-3)
    check_prediction(t.value("fraction_with_correction_after_4"), corrected[0],
                     "read after 4 writes, with correction",
                     hint="with the correction, what is gamma for a key the memory already "
                          "holds, and so how does c change?", atol=1e-3)


def make_armt(silent: bool = False) -> nn.Module:
    """The kit's small ARMT, seeded; W_V randomised so the memory matters (zero if silent)."""
    torch.manual_seed(0)
    model = build_model(CAPSTONE)
    for layer in model.memory.values():
        nn.init.normal_(layer.w_v.weight, std=0.0 if silent else 0.3)
    return model


def capstone_batches(seed: int = 4, count: int = 8) -> list:
    """``count`` (tokens, targets) batches of 4 rows of 16 symbols, 39 tokens: 5 segments."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 16, (4, 40), generator=gen) for _ in range(count)]
    return [(x[:, :-1], x[:, 1:]) for x in rows]


def plug_in(t, model: nn.Module) -> int:
    """The student's layer in place of every kit AssociativeMemoryLayer, with its weights."""
    layer_class = t.answer("MyAssociativeMemoryLayer")
    return swap_modules(model, armt.AssociativeMemoryLayer, lambda old: layer_class(
        old.w_k.in_features, old.w_k.out_features, old.normalize_phi, old.correction, old.eps))


capstone("nb06-19", make_armt, plug_in)


@exercise_check("nb06-19", own_work={"MyAssociativeMemoryLayer": (
    armt.AssociativeMemoryLayer, armt.dpfp, armt.associative_read, armt.associative_write,
    armt.novelty)})
def memory_layer_check(t):
    """MyAssociativeMemoryLayer inside the kit's ARMT: the same logits, causal, the same loss
    curve over 8 training steps on batches drawn anew. Returns (the kit's curve, yours)."""
    return check_capstone(t, capstone_batches(seed=t.fresh_int(0, 1 << 30)),
                          "MyAssociativeMemoryLayer")
