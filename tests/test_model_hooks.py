"""The optional hooks declared on LanguageModel (lr_scales, stream, decode_tokens): their
defaults work on every model, and the core finds an override without duck typing."""

import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.compiling import DECODE_PART
from blockmem_lite.models.base import LanguageModel


def _model(arch: str) -> LanguageModel:
    torch.manual_seed(0)
    return build_model(preset("tiny", arch=arch).model).eval()


def test_default_stream_is_the_prefill_and_continues_step_by_step():
    model = _model("dense")
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 12))
    with torch.no_grad():
        full, _ = model.prefill(tokens, max_len=12)
        last, state = model.stream(tokens[:, :12])
        head, _ = model.stream(tokens[:, :5])
        _, state = model.prefill(tokens[:, :5], max_len=12)
        tail, _ = model.stream(tokens[:, 5:], state)
    torch.testing.assert_close(last, full[:, -1])
    torch.testing.assert_close(head, full[:, 4])
    torch.testing.assert_close(tail, full[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch,own", [("dense", {"decode_tokens"}), ("bcmt", {"decode_tokens", "lr_scales"}),
                                      ("armt", {"decode_tokens", "stream"}),
                                      ("moc", {"decode_tokens", "lr_scales"}),
                                      ("cat", {"lr_scales"})])
def test_has_own_names_exactly_the_overridden_hooks(arch, own):
    cls = type(_model(arch))
    assert {h for h in ("lr_scales", "stream", "decode_tokens") if cls.has_own(h)} == own


def test_the_defaults_of_a_model_without_hooks():
    """Dense scales no learning rate; CAT has no decode step of its own to compile."""
    assert _model("dense").lr_scales() == {}
    with pytest.raises(NotImplementedError, match="compile step instead"):
        _model("cat").decode_tokens(torch.zeros(1, 1, dtype=torch.long), None)
    assert DECODE_PART == "decode_tokens"
