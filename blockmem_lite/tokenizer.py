"""Tokenizers. The default is byte-level: 256 ids, one per UTF-8 byte, no downloads.

Bytes keep the vocabulary (and the LM head) tiny, so kit-scale models spend
their parameters on the mechanisms being taught. A Hugging Face tokenizer can
be used instead when one is already in the local cache: ``get_tokenizer(name)``, which
the data loaders (``corpora.make_loaders``) and the command line's generation call with
``TrainConfig.tokenizer`` (``--set tokenizer=NAME``).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100          # target id the loss skips (padding, prompt positions)


class ByteTokenizer:
    """UTF-8 bytes <-> ids 0..255. Decoding replaces invalid byte sequences."""

    vocab_size = 256
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_tensor(self, text: str) -> torch.Tensor:
        """(N,) int64 tensor of byte ids."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        bad = [i for i in ids if not 0 <= int(i) < 256]
        if bad:
            raise ValueError(f"ids {bad[:5]} are not allowed: byte ids must be in [0, 255]")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


class HFTokenizer:
    """A thin wrapper around a locally cached ``transformers`` tokenizer."""

    def __init__(self, name: str):
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ImportError("a Hugging Face tokenizer needs the 'hf' extra: pip install -e '.[hf]'") from e
        try:
            self._tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except OSError as e:
            raise OSError(
                f"tokenizer {name!r} is not in the local Hugging Face cache and the kit never "
                "downloads at run time; download it once yourself (with network), or use the "
                "default byte tokenizer") from e
        self.name = name
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text)

    def encode_tensor(self, text: str) -> torch.Tensor:
        return torch.tensor(self.encode(text), dtype=torch.long)

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._tok.decode(ids)


def get_tokenizer(name: str = "bytes"):
    """``"bytes"`` (default) or the name of a locally cached HF tokenizer."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tokenizer={name!r} is not allowed: expected 'bytes' or the name of "
                         "a Hugging Face tokenizer in the local cache")
    return ByteTokenizer() if name == "bytes" else HFTokenizer(name)
