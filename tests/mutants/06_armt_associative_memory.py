"""Planted wrong answers for notebooks/solutions/06_armt_associative_memory.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
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
    ],
    "nb06-09": [  # my_write
        ("the correction term dropped (gamma = 1 always)",
         "gamma = (1 - seen / k_phi.pow(2).sum(-1)).clamp(0, 1).detach()",
         "gamma = torch.ones_like(beta)"),
        ("no delta rule: writes v instead of v - v_bar",
         "A = A + k_phi.transpose(1, 2) @ (beta[..., None] * (v - v_bar))",
         "A = A + k_phi.transpose(1, 2) @ (beta[..., None] * v)"),
        ("beta not applied",
         "A = A + k_phi.transpose(1, 2) @ (beta[..., None] * (v - v_bar))",
         "A = A + k_phi.transpose(1, 2) @ (v - v_bar)"),
        ("transposed update: (D, K) instead of (K, D)",
         "A = A + k_phi.transpose(1, 2) @ (beta[..., None] * (v - v_bar))",
         "A = A + (beta[..., None] * (v - v_bar)).transpose(1, 2) @ k_phi"),
        ("z updated without gamma",
         "z = z + (gamma[..., None] * k_phi).sum(dim=1)", "z = z + k_phi.sum(dim=1)"),
        ("z: mean over the written tokens instead of the sum",
         "z = z + (gamma[..., None] * k_phi).sum(dim=1)",
         "z = z + (gamma[..., None] * k_phi).mean(dim=1)"),
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
    ],
    "nb06-18": [  # armt_state_bytes
        ("memory_layers ignored: every layer wrapped",
         "n_wrapped = model_cfg.n_layer if model_cfg.memory_layers is None else "
         "len(model_cfg.memory_layers)",
         "n_wrapped = model_cfg.n_layer"),
        ("DPFP expansion forgotten: key dim 2 d_mem instead of 6 d_mem",
         "key_dim = 6 * model_cfg.d_mem", "key_dim = 2 * model_cfg.d_mem"),
        ("the normaliser z forgotten",
         "(key_dim * model_cfg.d_model + key_dim)", "(key_dim * model_cfg.d_model)"),
        ("the memory tokens not cached",
         "(model_cfg.segment_size + model_cfg.n_mem_tokens)", "model_cfg.segment_size"),
        ("keys only, the values forgotten",
         "caches = model_cfg.n_layer * 2 *", "caches = model_cfg.n_layer *"),
        ("the batch forgotten",
         "return batch * bytes_per_number *", "return bytes_per_number *"),
    ],
}
