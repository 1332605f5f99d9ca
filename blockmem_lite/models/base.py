"""The interface every model in the kit shares, and the registry.

Because every architecture implements the same ``LanguageModel`` interface,
the trainer, the benchmarks, the dashboard and the notebooks never branch on
the architecture:

* ``forward(tokens, targets=None) -> ModelOutput(logits, loss, aux_loss)``
  tokens, targets: (B, T) int64; targets == -100 are ignored in the loss.
* ``prefill(tokens, max_len) -> (logits (B, T, V), state)`` and
  ``step(token, state) -> (logits (B, V), state)``: incremental decoding.
  Step-by-step logits must equal the full forward's (tests prove it).
* ``generate(prompt, max_new_tokens, ...)`` built on prefill/step.
* ``State.nbytes()`` reports the bytes the decoding state holds, so cache
  memory is comparable across mechanisms.

Which class serves which ``arch`` is the registry's business (``registry.py``):
each mechanism module registers a ``Mechanism`` naming its model class.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite import registry
from blockmem_lite.tokenizer import IGNORE_INDEX
from blockmem_lite.validation import check_float, check_int


def available_archs() -> list[str]:
    """Every registered architecture (built-in, plugins, installed entry points)."""
    return registry.names()


def build_model(cfg) -> LanguageModel:
    """Build the model for ``cfg`` (a ModelConfig, or a RunConfig whose ``.model`` is used).

    Its weights are drawn by name (``nn.keyed_normal_``), and building leaves torch's global
    random state as it found it, so twins built under one seed also see the same dropout
    and sampling afterwards."""
    model_cfg = getattr(cfg, "model", cfg)
    with torch.random.fork_rng(devices=[]):
        model = registry.get(model_cfg.arch).model(model_cfg)
    if not isinstance(model, LanguageModel):
        built = type(model).__name__ if isinstance(model, nn.Module) \
            else f"{type(model).__name__} {_short_repr(model)}"
        raise ValueError(f"arch={model_cfg.arch!r}: its model(cfg) returned {built}: expected a "
                         "LanguageModel (a torch.nn.Module subclassing blockmem_lite.models.base."
                         "LanguageModel, with forward, prefill and step)")
    return model


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class ModelExited(RuntimeError):
    """A model's own code called ``sys.exit``: an error naming it, so a command reports it (and
    keeps what it trained) instead of ending silently."""


def model_name(model) -> str:
    """A model's arch (where its cfg has one) and class, for messages: 'swa' (SlidingWindowLM)."""
    arch = getattr(getattr(model, "cfg", None), "arch", None)
    return f"{arch!r} ({type(model).__name__})" if arch else type(model).__name__


def check_output(out, tokens: torch.Tensor, vocab_size: int | None, name: str) -> None:
    """Refuse (ValueError) what ``forward(tokens, targets)`` returned when it breaks the
    LanguageModel contract: logits (B, T, vocab_size) and a finite scalar loss with a
    gradient. ``name`` (``model_name``) is named; the Trainer checks its first step."""
    b, t = tokens.shape                                              # tokens: (B, T)
    logits = getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor):
        problem = f"returned {type(out).__name__} without logits: expected a ModelOutput"
    elif logits.dim() != 3 or tuple(logits.shape[:2]) != (b, t) \
            or vocab_size not in (None, logits.shape[2]):
        problem = (f"returned logits of shape {tuple(logits.shape)}: expected "
                   f"{(b, t, vocab_size or 'V')} = (batch, time, vocab_size), one row per token")
    else:
        problem = _loss_problem(out)
    if problem:
        raise ValueError(f"mechanism {name} breaks the LanguageModel contract on the first "
                         f"training step: forward(tokens {(b, t)}, targets) {problem}")


def _loss_problem(out) -> str:
    """What is wrong with ``out``'s losses ('' when nothing): each a scalar tensor, the loss
    finite (before any update) and differentiable."""
    for key in ("loss", "ce_loss", "aux_loss"):
        value = getattr(out, key, None)
        if (value is not None or key == "loss") and not (
                isinstance(value, torch.Tensor) and value.dim() == 0):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else value
            return (f"returned {key}={shape!r}: expected a scalar tensor (shape ()), e.g. "
                    "self.output(logits, targets)")
    if not bool(torch.isfinite(out.loss.detach())):
        return f"returned loss={out.loss.item()} before any update: expected a finite number"
    if torch.is_grad_enabled() and not out.loss.requires_grad:
        return "returned a loss without a gradient (detached from the weights)"
    return ""


@dataclass
class ModelOutput:
    logits: torch.Tensor                 # (B, T, V)
    loss: torch.Tensor | None = None     # scalar: cross-entropy + aux_loss
    aux_loss: torch.Tensor | None = None  # scalar: auxiliary terms already in loss (0 if none)
    ce_loss: torch.Tensor | None = None  # scalar: the language-model cross-entropy alone
    extras: dict | None = None           # named scalars reported apart, e.g. MoC's lb_loss


class State(abc.ABC):
    """Decoding state of one model (KV caches, memories...). Subclasses hold tensors."""

    @abc.abstractmethod
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the state holds; ``nbytes`` sums them."""

    def nbytes(self) -> int:
        """Bytes held by the state (what decoding keeps in memory besides the weights)."""
        seen, total = set(), 0
        for t in self.tensors():
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose target is not IGNORE_INDEX."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def check_tokens(tokens: torch.Tensor, vocab_size: int, max_len: int | None = None) -> None:
    """Clear errors for token tensors of the wrong shape, dtype or range."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"tokens of shape {shape} are not allowed: expected a (batch, time) tensor")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens.dtype={tokens.dtype} is not allowed: expected torch.long")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"tokens of shape {tuple(tokens.shape)} (batch={tokens.shape[0]}, "
                         f"T={tokens.shape[1]}) are not allowed: expected at least one sequence "
                         "of at least one token")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids in [{tokens.min().item()}, {tokens.max().item()}] are not "
                         f"allowed: expected ids in [0, {vocab_size - 1}] (vocab_size={vocab_size})")
    if max_len is not None and tokens.shape[1] > max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} is not allowed: this model's "
                         f"maximum is {max_len}")


class LanguageModel(nn.Module, metaclass=abc.ABCMeta):
    """Base class: subclasses implement ``forward``, ``prefill`` and ``step``."""

    # the names it records under ``trace`` (glob patterns after the ``layer{i}.`` style
    # scopes, e.g. "layer*.gate"): what a notebook may ask ``with trace(model) as t`` for
    trace_keys: tuple[str, ...] = ()

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    # --- interface -----------------------------------------------------------------
    @abc.abstractmethod
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        """tokens, targets: (B, T) -> ModelOutput (targets == IGNORE_INDEX do not count)."""

    @abc.abstractmethod
    def prefill(self, tokens: torch.Tensor, max_len: int | None = None):
        """Run the prompt (B, T); return (logits (B, T, V), state) ready for ``step``.

        ``max_len`` is the total length the state must hold (prompt + new tokens).
        """

    @abc.abstractmethod
    def step(self, token: torch.Tensor, state: State):
        """Feed one token per sequence, (B,) or (B, 1); return (logits (B, V), state)."""

    def __call__(self, *args, **kwargs):
        """nn.Module's call; a ``sys.exit`` in the model's code becomes ``ModelExited``."""
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as err:
            raise ModelExited(f"the model {model_name(self)} called sys.exit({err.code!r}) in "
                              "its forward: a model must raise an exception, not exit") from err

    # --- optional hooks: the core calls them on every model; override where it pays ----------
    def lr_scales(self) -> dict[str, float]:
        """{parameter-name prefix: learning-rate factor}; the Trainer gives each matching
        parameter group that share of the lr (MoC's memory layers). Default: none."""
        return {}

    def stream(self, tokens: torch.Tensor, state: State | None = None):
        """Read ``tokens`` (B, T) for inference: (logits of the last token (B, V), state ready
        for ``step``). Default: ``prefill`` a fresh state of exactly T slots, or ``step`` token
        by token through a given ``state``. A model that reads any length in constant memory
        overrides it (ARMT, segment by segment); the inference bench calls it."""
        if state is None:
            logits, state = self.prefill(tokens, max_len=tokens.shape[1])
            return logits[:, -1], state
        logits = None
        for token in tokens.unbind(dim=1):                     # (B,) each
            logits, state = self.step(token, state)
        return logits, state

    def decode_tokens(self, tokens: torch.Tensor, state: State) -> torch.Tensor:
        """The per-token part of ``step``, (B, t) -> logits (B, t, V), updating ``state`` in
        place, without the bookkeeping that changes shape (closing a block or segment):
        ``--compile`` compiles it alone where a model overrides it (``has_own``), else the
        whole ``step``. Default: not split out."""
        raise NotImplementedError(f"{type(self).__name__} does not split decode_tokens out of "
                                  "step (compile step instead)")

    @classmethod
    def has_own(cls, hook: str) -> bool:
        """Whether this class overrides the optional hook ``hook`` of LanguageModel."""
        return getattr(cls, hook) is not getattr(LanguageModel, hook)

    # --- shared helpers ------------------------------------------------------------
    def output(self, logits: torch.Tensor, targets: torch.Tensor | None,
               aux_loss: torch.Tensor | None = None) -> ModelOutput:
        """Package logits with CE (+ aux) loss the same way for every model."""
        aux = aux_loss if aux_loss is not None else logits.new_zeros(())
        if targets is None:
            return ModelOutput(logits=logits, aux_loss=aux)
        ce = lm_loss(logits, targets)
        return ModelOutput(logits=logits, loss=ce + aux, aux_loss=aux, ce_loss=ce)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, greedy: bool = False,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue ``prompt`` (B, T) by ``max_new_tokens``; returns (B, T + new).

        ``greedy=True`` (or temperature 0) takes the argmax; otherwise samples
        from softmax(logits / temperature), optionally restricted to ``top_k``.
        """
        check_int("max_new_tokens", max_new_tokens, 0)
        check_float("temperature", temperature, 0.0)
        if top_k is not None:
            check_int("top_k", top_k, 1)
        was_training = self.training
        self.eval()
        logits, state = self.prefill(prompt, max_len=prompt.shape[1] + max_new_tokens)
        next_logits = logits[:, -1]                          # (B, V)
        out = [prompt]
        for i in range(max_new_tokens):
            token = _pick(next_logits, temperature, top_k, greedy, generator)  # (B,)
            out.append(token[:, None])
            if i + 1 < max_new_tokens:
                next_logits, state = self.step(token, state)
        self.train(was_training)
        return torch.cat(out, dim=1)


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, greedy: bool,
          generator: torch.Generator | None) -> torch.Tensor:
    """Choose the next token from logits (B, V)."""
    if greedy or temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
