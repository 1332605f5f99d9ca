"""Planted wrong answers for notebooks/solutions/06_armt_associative_memory.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)
and, for some, the phrases the check's message must contain)]. tests/test_mutants.py
substitutes each one and proves the check cell rejects it (and says so).
"""

MUTANTS = {
    "nb06-05": [  # my_dpfp
        ("rolls start at 0: squares r * r included",
         "for j in range(1, nu + 1)", "for j in range(nu)"),
        ("normalised over the wrong dimension",
         "F.normalize(phi, dim=-1)", "F.normalize(phi, dim=-2)"),
        ("the negative part kept negative: features not non-negative",
         "torch.cat([F.relu(u), F.relu(-u)], dim=-1)", "torch.cat([F.relu(u), -F.relu(-u)], dim=-1)"),
        ("rolled over the positions instead of the features",
         "torch.roll(r, j, dims=-1) for j in", "torch.roll(r, j, dims=-2) for j in"),
        ("normalised to sum 1 instead of unit length",
         "F.normalize(phi, dim=-1)", "phi / phi.sum(-1, keepdim=True)"),
        ("rolled the other way: each entry paired with the one j places later",
         "torch.roll(r, j, dims=-1) for j in", "torch.roll(r, -j, dims=-1) for j in"),
        ("calls the kit's armt.dpfp instead of writing it",
         "return F.normalize(phi, dim=-1) if normalize else phi",
         "return armt.dpfp(u, nu, normalize)"),
    ],
    "nb06-09": [  # my_write_heads
        ("the correction term dropped (gamma = 1 always)",
         "gamma = novelty if correction else torch.ones_like(novelty)",
         "gamma = torch.ones_like(novelty)"),
        ("no delta rule: writes v instead of v - v_bar",
         "beta[..., None] * (v - v_bar)", "beta[..., None] * v"),
        ("beta not applied",
         "beta[..., None] * (v - v_bar)", "(v - v_bar)"),
        ("transposed update: (Dh, K) instead of (K, Dh) per head",
         'torch.einsum("bhmk,bhmd->bhkd", k_phi, beta', 'torch.einsum("bhmk,bhmd->bhdk", k_phi, beta'),
        ("heads mixed: the update summed over the heads",
         'torch.einsum("bhmk,bhmd->bhkd", k_phi, beta', 'torch.einsum("bhmk,bhmd->bkd", k_phi, beta'),
        ("z updated without gamma",
         'z = z + torch.einsum("bhmk,bhm->bhk", k_phi, gamma)', "z = z + k_phi.sum(dim=2)"),
        ("z: mean over the written pairs instead of the sum",
         'z = z + torch.einsum("bhmk,bhm->bhk", k_phi, gamma)',
         'z = z + torch.einsum("bhmk,bhm->bhk", k_phi, gamma) / k_phi.shape[2]'),
        ("gamma divides by |k| instead of |k|^2 (the same only for unit keys)",
         "k_dot_z / k_phi.pow(2).sum(-1)", "k_dot_z / k_phi.norm(dim=-1)"),
        ("gamma not clipped: a key counted more than once makes z shrink",
         "(1 - k_dot_z / k_phi.pow(2).sum(-1)).clamp(0, 1).detach()",
         "(1 - k_dot_z / k_phi.pow(2).sum(-1)).detach()"),
        ("calls the kit's armt.associative_read for v_bar",
         'v_bar = torch.einsum("bhmk,bhkd->bhmd", k_phi, A) / k_dot_z[..., None]',
         "v_bar = armt.associative_read(k_phi, A, z, eps)"),
    ],
    "nb06-14": [  # predicted fractions after repeated writes
        ("after 2 writes: the full value",
         "fraction_after_2 = 0.5", "fraction_after_2 = 1.0"),
        ("after 4 writes: halved at every write",
         "fraction_after_4 = 0.5", "fraction_after_4 = 0.25"),
        ("z growth off by one (counts the later writes only)",
         "z_growth_after_4 = 4.0", "z_growth_after_4 = 3.0"),
        ("with correction: still diluted",
         "fraction_with_correction_after_4 = 1.0", "fraction_with_correction_after_4 = 0.5"),
        ("after 4 writes: back to the full value (the delta rule fixes the read)",
         "fraction_after_4 = 0.5", "fraction_after_4 = 1.0"),
    ],
    "nb06-19": [  # the capstone: MyAssociativeMemoryLayer plugged into an ARMT
        ("no correction term: gamma = 1 at every write",
         "new = new if correction else torch.ones_like(new)", "new = torch.ones_like(new)"),
        ("memory not carried to the next segment: A restarts from the update",
         'A_new = A_old + torch.einsum("bmk,bmd->bkd", k, beta * (v - stored))',
         'A_new = torch.einsum("bmk,bmd->bkd", k, beta * (v - stored))'),
        ("z not updated after the first write",
         "z_new = z_old + (new * k).sum(dim=1)",
         "z_new = z_old + (new * k).sum(dim=1) if memory is None else z_old"),
        ("transposed A: (B, D, K) instead of (B, K, D); runs because K = D",
         'torch.einsum("bmk,bmd->bkd", k, beta', 'torch.einsum("bmk,bmd->bdk", k, beta'),
        ("no delta rule: the write ignores what is stored (v instead of v - v_bar)",
         "beta * (v - stored)", "beta * v"),
        ("gamma lets gradient through (no stop-gradient)",
         "new = (1 - seen / norm2).clamp(0, 1).detach()", "new = (1 - seen / norm2).clamp(0, 1)",
         ("the forward is right, the gradients are not", "gamma")),
        ("the write strength without its sigmoid",
         "beta = torch.sigmoid(self.w_beta(m))", "beta = self.w_beta(m)"),
        ("the read queries made with W_K instead of W_Q",
         "q = my_dpfp3(self.w_q(h), self.normalize_phi)", "q = my_dpfp3(self.w_k(h), self.normalize_phi)",
         ("segment 1, layer 0: the read", "queries")),
        ("the first write counts nothing in z (gamma = 0 on an empty memory)",
         "stored, new = torch.zeros_like(v), torch.ones_like(beta)",
         "stored, new = torch.zeros_like(v), torch.zeros_like(beta)"),
        ("calls the kit's armt.associative_read",
         "numerator = torch.einsum(\"btk,bkd->btd\", q, A)\n"
         "        return numerator / (torch.einsum(\"btk,bk->bt\", q, z)[..., None] + self.eps)",
         "return armt.associative_read(q, A, z, self.eps)"),
    ],
}

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
CHEATS = {
    "nb06-05": [  # my_dpfp
        ("float32 features where the task keeps float64",
         "return F.normalize(phi, dim=-1) if normalize else phi",
         "return (F.normalize(phi, dim=-1) if normalize else phi).float()"),
        ("the kit's dpfp copied with types.FunctionType",
         "return F.normalize(phi, dim=-1) if normalize else phi",
         _REDEFINE + "import types\n_copy = types.FunctionType(armt.dpfp.__code__, "
         "armt.dpfp.__globals__, 'c', armt.dpfp.__defaults__)\n\n\n"
         "def my_dpfp(u, nu=3, normalize=True):\n    return _copy(u, nu, normalize)"),
    ],
    "nb06-09": [  # my_write_heads
        ("gamma without the stop-gradient the task asks for",
         "novelty = (1 - k_dot_z / k_phi.pow(2).sum(-1)).clamp(0, 1).detach()",
         "novelty = (1 - k_dot_z / k_phi.pow(2).sum(-1)).clamp(0, 1)",
         ("no stop-gradient on gamma",)),
        ("the kit's associative_write reached through getattr, head by head",
         "return A, z",
         _REDEFINE + "def my_write_heads(A, z, k_phi, v, beta, correction=True, eps=EPS):\n"
         "    kit = getattr(armt, 'associative_' + 'write')\n"
         "    flat = lambda x: None if x is None else x.flatten(0, 1)\n"
         "    new_A, new_z = kit(flat(A), flat(z), flat(k_phi), flat(v), flat(beta), correction)\n"
         "    b, h = k_phi.shape[:2]\n"
         "    return new_A.view(b, h, *new_A.shape[1:]), new_z.view(b, h, *new_z.shape[1:])"),
    ],
}
