"""A test helper (not a test module): decode a sequence by prefill, then one step a token."""

import torch


def prefill_then_step(model, x: torch.Tensor, prompt_len: int):
    """Prefill ``prompt_len`` tokens of x (B, T), then step one token at a time ->
    (logits (B, T, V), final state): what a cached decode gives for every position."""
    logits, state = model.prefill(x[:, :prompt_len])
    pieces = [logits]
    for t in range(prompt_len, x.shape[1]):
        step_logits, state = model.step(x[:, t], state)
        pieces.append(step_logits[:, None])
    return torch.cat(pieces, 1), state
