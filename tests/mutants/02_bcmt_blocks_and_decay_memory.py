"""Planted wrong answers for notebooks/solutions/02_bcmt_blocks_and_decay_memory.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "nb02-05": [  # multi_rate_decay_weights
        ("calls the kit: decay_weights one rate at a time",
         "return powers / powers.sum(dim=-1, keepdim=True)",
         "return torch.stack([decay_weights(n_blocks, float(a), torch.float64) for a in alphas])"),
        ("missing normalisation: rows do not sum to 1",
         "return powers / powers.sum(dim=-1, keepdim=True)", "return powers"),
        ("normalised over the wrong axis (columns)",
         "powers.sum(dim=-1, keepdim=True)", "powers.sum(dim=-2, keepdim=True)"),
        ("transposed: weights on the future blocks (j >= i)",
         "powers.masked_fill(j > i, 0.0)", "powers.masked_fill(j < i, 0.0)"),
        ("lag the wrong way round (j - i)",
         "(i - j).clamp(min=0)", "(j - i).clamp(min=0)"),
        ("off by one: a block does not weigh its own summary (j < i kept)",
         "powers.masked_fill(j > i, 0.0)", "powers.masked_fill(j >= i, 0.0)"),
        ("future entries not zeroed (alpha^0 = 1 above the diagonal)",
         "powers = powers.masked_fill(j > i, 0.0)", "powers = powers"),
        ("rates broadcast over the wrong dimension",
         "alphas[:, None, None] ** steps_back", "alphas[None, :, None] ** steps_back"),
        ("alpha^i / alpha^j instead of alpha^(i-j): 0/0 at alpha = 0, overflow for many blocks",
         "alphas[:, None, None] ** steps_back",
         "alphas[:, None, None] ** i / alphas[:, None, None] ** j"),
    ],
    "nb02-08": [  # padded_block_summaries
        ("calls the kit: block_summaries on the masked scores",
         "    return summaries, pi",
         "    summaries, pi = block_summaries(states.flatten(1, 2), scores, block_size)\n"
         "    return summaries.nan_to_num(0.0), pi.nan_to_num(0.0)"),
        ("padding not masked: padded positions get weight",
         '.masked_fill(~real, float("-inf"))', ""),
        ("off by one: the first padding position counts as real",
         "position < lengths[:, None]", "position <= lengths[:, None]"),
        ("lengths broadcast along time instead of the batch",
         "position < lengths[:, None]", "position < lengths[None, :]"),
        ("a block with no real token gives NaN (softmax of all -inf not handled)",
         ".softmax(dim=-1).nan_to_num(0.0)", ".softmax(dim=-1)"),
        ("softmax over the blocks instead of within a block",
         "scores.view(b, n, block_size).softmax(dim=-1)",
         "scores.view(b, n, block_size).softmax(dim=-2)"),
        ("missing normalisation: exp instead of softmax",
         ".softmax(dim=-1).nan_to_num(0.0)", ".exp()"),
        ("plain mean instead of the weighted sum",
         "(pi[..., None] * states).sum(dim=2)", "states.mean(dim=2)"),
        ("blocks interleaved: (B, L, N, D) view transposed",
         ".view(b, n, block_size, d)", ".view(b, block_size, n, d).transpose(1, 2)"),
        ("states padded at the front instead of the end",
         "F.pad(states, (0, 0, 0, missing))", "F.pad(states, (0, 0, missing, 0))"),
    ],
    "nb02-12": [  # fixed_shift
        ("calls the kit: shift_one_block for the usual lag",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)",
         "return shift_one_block(memories) if k == 1 else "
         "torch.cat([zeros, memories[:, :n - k]], dim=1)"),
        ("torch.roll again: the first blocks read the last blocks' memories",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)",
         "return torch.roll(memories, shifts=k, dims=1)"),
        ("no shift: block i reads its own memory M_i",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)", "return memories"),
        ("shifted the wrong way: block i reads M_{i+k}",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)",
         "return torch.cat([memories[:, k:], zeros], dim=1)"),
        ("the first blocks keep their own memories instead of zeros",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)",
         "return torch.cat([memories[:, :k], memories[:, :n - k]], dim=1)"),
        ("slice with -k: a lag of 0 keeps nothing",
         "memories[:, :n - k]", "memories[:, :-k]"),
        ("lag not capped at N: too many zeros for k > N",
         "k = min(k, n)", "k = k"),
        ("shifted along the feature dimension",
         "return torch.cat([zeros, memories[:, :n - k]], dim=1)",
         "return torch.cat([memories.new_zeros(*memories.shape[:2], k), "
         "memories[:, :, :memories.shape[2] - k]], dim=2)"),
    ],
    "nb02-16": [  # predicted_memory + predicted_horizon
        ("calls the kit: memory_matrix_form at alpha = 0",
         "return summaries.clone()", "return memory_matrix_form(summaries, 0.0)"),
        ("calls the notebook's effective_horizon",
         'return 1 if limit == "zero" else math.ceil(0.9 * n_blocks)',
         'return effective_horizon(0.0 if limit == "zero" else 1.0, n_blocks)'),
        ("alpha -> 0 predicted as no memory at all (zeros)",
         "return summaries.clone()", "return torch.zeros_like(summaries)"),
        ("alpha = 1: missing normalisation (running sum, not mean)",
         "return summaries.cumsum(dim=1) / counts[None, :, None]",
         "return summaries.cumsum(dim=1)"),
        ("alpha = 1: cumulative mean over the features instead of the blocks",
         "summaries.cumsum(dim=1)", "summaries.cumsum(dim=2)"),
        ("alpha = 1: counts off by one",
         "torch.arange(1, summaries.shape[1] + 1,", "torch.arange(2, summaries.shape[1] + 2,"),
        ("horizon rounded down instead of up",
         "math.ceil(0.9 * n_blocks)", "math.floor(0.9 * n_blocks)"),
        ("horizon rounded to nearest",
         "math.ceil(0.9 * n_blocks)", "round(0.9 * n_blocks)"),
        ("alpha -> 0 horizon: 0 blocks instead of 1",
         'return 1 if limit == "zero"', 'return 0 if limit == "zero"'),
        ("alpha = 1 horizon: every block instead of 90%",
         "math.ceil(0.9 * n_blocks)", "n_blocks"),
        ("alpha -> 0 memory predicted as the previous block's summary (the shift folded in)",
         "return summaries.clone()", "return summaries.roll(1, dims=1)"),
    ],
}

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
CHEATS = {
    "nb02-05": [  # multi_rate_decay_weights
        ("float32 where the task says float64",
         "return powers / powers.sum(dim=-1, keepdim=True)",
         "return (powers / powers.sum(dim=-1, keepdim=True)).float()"),
        ("the kit's decay_weights kept in a default argument, one rate at a time",
         "return powers / powers.sum(dim=-1, keepdim=True)",
         _REDEFINE + "def multi_rate_decay_weights(n_blocks, alphas, _kit=decay_weights):\n"
         "    return torch.stack([_kit(n_blocks, a, torch.float64) for a in alphas])"),
    ],
    "nb02-08": [  # padded_block_summaries: the check's reference helper lives in its module
        ("the check's own reference helper imported from its module and called by name",
         "return summaries, pi",
         "from blockmem_lite.exercise_checks.nb02 import kit_summaries\n"
         "    return tuple(kit_summaries(states, scores, block_size, lengths))"),
        ("the check's reference helper looked up at call time",
         "return summaries, pi",
         "import importlib\n"
         "    kit = getattr(importlib.import_module('blockmem_lite.exercise_checks.nb02'),\n"
         "                  'kit_' + 'summaries')\n"
         "    return tuple(kit(states, scores, block_size, lengths))"),
    ],
}
