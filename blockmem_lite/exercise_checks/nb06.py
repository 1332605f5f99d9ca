"""The checks of exercises/06_armt_associative_memory.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from blockmem_lite.checks import CheckFailed, check_close, check_equal, check_shape
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.exercise_checks.plugged import capstone, check_capstone
from blockmem_lite.models import armt, build_model
from blockmem_lite.own_work import check_gradients, check_prediction
from blockmem_lite.plugged_in import Part, Probe, swap_modules

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

    inputs, names = (old_A, old_z, k, v, beta), ("A", "z", "k_phi", "v", "beta")
    try:
        check_gradients(my_write_heads, kit_heads, inputs, "my_write_heads, stored memory",
                        names=names)
    except CheckFailed as err:
        headline = which_gradients(my_write_heads, kit_heads, inputs, names, gen)
        raise CheckFailed("\n".join([headline] + [f"  {line}" for line in
                                                  str(err).splitlines()])) from None
    _reads_back(my_write_heads, gen)


def write_without_stop_gradient(A, z, k_phi, v, beta):
    """The kit's write per head with gamma carrying a gradient: what a missing ``.detach()``
    on gamma computes. The same values as the kit's write, other gradients."""
    k_dot_z = torch.einsum("bhmk,bhk->bhm", k_phi, z)
    v_bar = torch.einsum("bhmk,bhkd->bhmd", k_phi, A) / (k_dot_z[..., None] + armt.EPS)
    gamma = (1 - (k_dot_z + armt.EPS) / k_phi.pow(2).sum(-1)).clamp(0, 1)       # no detach
    return (A + torch.einsum("bhmk,bhmd->bhkd", k_phi, beta[..., None] * (v - v_bar)),
            z + torch.einsum("bhmk,bhm->bhk", k_phi, gamma))


def _gradients(fn, inputs: tuple, weights: list) -> list[torch.Tensor]:
    """The gradients of sum(weights * fn(*inputs)) with respect to each input (zeros where
    none reaches it)."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    with torch.enable_grad():
        total = sum((w * o).sum() for w, o in zip(weights, fn(*leaves), strict=True))
        found = torch.autograd.grad(total, leaves, allow_unused=True) if total.requires_grad \
            else [None] * len(leaves)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, found, strict=True)]


def which_gradients(my_write_heads, kit_heads, inputs: tuple, names: tuple,
                    gen: torch.Generator) -> str:
    """The first line of a gradient failure: which inputs' gradients differ, and whether they
    are those of a write whose gamma carries a gradient (no stop-gradient on gamma)."""
    weights = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in inputs[:2]]
    mine, kit, loose = (_gradients(fn, inputs, weights) for fn in (
        my_write_heads, kit_heads, write_without_stop_gradient))
    close = [torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(mine, kit, strict=True)]
    wrong = ", ".join(n for n, ok in zip(names, close, strict=True) if not ok) or "none"
    right = ", ".join(n for n, ok in zip(names, close, strict=True) if ok) or "none"
    if wrong != "none" and all(torch.allclose(a, b, rtol=1e-6, atol=1e-9)
                               for a, b in zip(mine, loose, strict=True)):
        return (f"my_write_heads: no stop-gradient on gamma? the gradients with respect to "
                f"{wrong} are those of a write whose gamma carries a gradient; the task puts "
                "gamma under .detach(), so no gradient flows through it")
    return (f"my_write_heads: the values are right, the gradients are not: those with respect "
            f"to {wrong} differ from the kit's (those of {right} match)")


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


ARMT_WRITES = {
    "A0": "the first write's update of A: the keys phi(W_K m), the values W_V m, the write "
          "strength beta = sigmoid(w_beta m), the outer products summed",
    "A": "the update of A onto a stored memory (the first write matches): the old A kept, the "
         "delta rule beta (v - v_bar) with v_bar read from the old memory",
    "z0": "the first write's update of z: each key counted once (gamma = 1 on an empty memory)",
    "z": "the update of z onto a stored memory (the first write matches): the old z kept, each "
         "key counted by its gamma (the correction)",
}


def armt_parts(model: nn.Module, tokens: torch.Tensor) -> list[Part]:
    """Every read and write of the model's memory layers, in the order the segments make
    them: a read's output (B, n, D), a write's A and z."""
    found, written = [], {}
    size, length = model.segment_size, tokens.shape[1]

    def watch(i: int, layer: nn.Module) -> None:
        read, write = layer.read, layer.write

        def reading(h, memory):
            out, s = read(h, memory), written.get(i, 0)
            n = min(size, length - s * size)          # the segment's tokens; memory tokens after
            uses = tuple(s * size + j if j < n else (s + 1) * size for j in range(out.shape[1]))
            found.append(Part(f"segment {s}, layer {i}: the read", "read", out, uses))
            return out

        def writing(m, memory):
            A, z = write(m, memory)
            s = written[i] = written.get(i, 0) + 1
            first = "0" if memory is None else ""
            for name, value in (("A", A), ("z", z)):
                found.append(Part(f"segment {s - 1}, layer {i}: the write's {name}",
                                  name + first, value.reshape(value.shape[0], 1, -1),
                                  (s * size,), ""))
            return A, z

        layer.read, layer.write = reading, writing

    layers = {int(key): layer for key, layer in model.memory.items()}
    for i, layer in layers.items():
        watch(i, layer)
    try:
        model(tokens)
    finally:
        for layer in layers.values():
            del layer.read, layer.write
    return found


def scaled_copy(yours: torch.Tensor, kit: torch.Tensor) -> bool:
    """True when ``yours`` is, row by row, ``kit`` times a number: the same direction, another
    normaliser."""
    yours, kit = yours.double(), kit.double()
    factor = (yours * kit).sum(-1, keepdim=True) / (kit * kit).sum(-1, keepdim=True).clamp_min(
        1e-30)
    rest = (yours - factor * kit).norm(dim=-1)
    return bool((rest <= 1e-3 * yours.norm(dim=-1) + 1e-9).all())


def explain_armt(part: Part, n, yours: torch.Tensor, kit: torch.Tensor) -> str:
    """What the first part of the student's layer that differs points to."""
    if part.kind != "read":
        return ARMT_WRITES[part.kind]
    if n is not None and scaled_copy(yours, kit):
        return ("its normaliser: your read is the kit's times a number per token (divide q A "
                "by q . z + eps)")
    return ("its queries phi(W_Q h), or q A: the memory it reads (from the writes before it) "
            "is the kit's")


ARMT_PROBE = Probe(
    where=lambda position: f"segment {position // CAPSTONE.segment_size}",
    parts=armt_parts, explain=explain_armt,
    training="the kit's layer stops the gradient at gamma (.detach()) and nowhere else: is "
             "gamma's stop-gradient missing, or one added elsewhere?")

capstone("nb06-19", make_armt, plug_in, probe=ARMT_PROBE)


@exercise_check("nb06-19", own_work={"MyAssociativeMemoryLayer": (
    armt.AssociativeMemoryLayer, armt.dpfp, armt.associative_read, armt.associative_write,
    armt.novelty)})
def memory_layer_check(t):
    """MyAssociativeMemoryLayer inside the kit's ARMT: the same logits, causal, the same loss
    curve over 8 training steps on batches drawn anew. Returns (the kit's curve, yours)."""
    return check_capstone(t, capstone_batches(seed=t.fresh_int(0, 1 << 30)),
                          "MyAssociativeMemoryLayer")
