"""CAT's compressor: one vector per chunk, chunks independent, order from ChunkPos."""

import pytest
import torch

from blockmem_lite.models.cat import Compressor

C = 4


def _compressor(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=256, d_model=16, n_head=2, depth=1, chunk_size=C, max_chunks=8,
                out_dim=24)
    return Compressor(**{**args, **kw}).double().eval()


def test_one_vector_of_decoder_width_per_chunk():
    f = _compressor()(torch.randint(0, 256, (2, 3 * C)))
    assert f.shape == (2, 3, 24)


def test_chunks_are_compressed_independently_and_bidirectionally():
    comp = _compressor()
    x = torch.randint(0, 256, (1, 3 * C))
    base = comp(x)
    y = x.clone()
    y[0, C + C - 1] = (y[0, C + C - 1] + 1) % 256     # last token of chunk 1
    moved = (comp(y) - base).abs().amax(-1)[0]       # (K,)
    assert moved[0] == 0 and moved[2] == 0           # other chunks untouched
    assert moved[1] > 1e-6                           # f_1 reads its whole chunk
    z = x.clone()
    z[0, C] = (z[0, C] + 1) % 256                    # first token of chunk 1 moves f_1 too
    assert (comp(z) - base).abs()[0, 1].max() > 1e-6


def test_chunk_position_gives_order():
    comp = _compressor()
    chunk = torch.randint(0, 256, (1, C))
    f = comp(chunk.repeat(1, 3))                     # the same chunk three times
    assert not torch.allclose(f[0, 0], f[0, 1])      # told apart only by ChunkPos


def test_every_compressor_parameter_gets_a_gradient():
    comp = _compressor().train()
    comp(torch.randint(0, 256, (2, 2 * C))).pow(2).sum().backward()
    for name, p in comp.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("length, message", [(C + 1, "multiple of chunk_size=4"),
                                             (9 * C, "max_chunks=8")])
def test_bad_lengths_are_clear_errors(length, message):
    with pytest.raises(ValueError, match=message):
        _compressor()(torch.randint(0, 256, (1, length)))
