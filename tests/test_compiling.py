"""torch.compile as an option (compiling.py): compiled decoding equals the full forward, every
recompilation happens within the first block / segment, and bench / Trainer take the option."""

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils.data import TensorDataset

from blockmem_lite import build_model, preset
from blockmem_lite.compiling import compile_decoding, is_decoding_compiled, uncompile_decoding
from blockmem_lite.config import TrainConfig
from blockmem_lite.measure import bench, bench_compile
from blockmem_lite.train import Callback, Trainer

SPAN = 8                       # block / segment size of the tiny models


def _model(arch, span=SPAN):
    sizes = {"dense": {}, "bcmt": {"block_size": span},
             "armt": {"segment_size": span, "n_mem_tokens": 2, "d_mem": 4}}[arch]
    model = build_model(preset("tiny", arch=arch, **sizes)).double().eval()
    for name, p in model.named_parameters():           # the memory paths carry real signal
        if name.endswith(("memory_proj.weight", "w_v.weight")):
            torch.nn.init.normal_(p, std=0.3)
    return model


def _compiles() -> int:
    return counters["frames"]["total"]


def _compiled_decoding(arch, span):
    """Decode 5 blocks / segments compiled: (logits == full forward, compiles after two
    blocks, compiles at the end)."""
    torch._dynamo.reset()
    start = _compiles()                                # the counter runs on across resets
    model = _model(arch, span)
    x = torch.randint(0, 256, (1, 5 * span + 3))
    with torch.no_grad():
        full = model(x).logits
        compile_decoding(model)
        assert is_decoding_compiled(model)
        # one spare slot: a dense cache filled exactly is one more special case (a recompile)
        logits, state = model.prefill(x[:, :3], max_len=x.shape[1] + 1)
        pieces = [logits]
        for t in range(3, x.shape[1]):
            if t == 2 * span + 1:                      # one block / segment and more seen
                settled = _compiles() - start
            step_logits, state = model.step(x[:, t], state)
            pieces.append(step_logits[:, None])
    same = torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)
    uncompile_decoding(model)
    assert not is_decoding_compiled(model) and "decode_tokens" not in vars(model)
    return same, settled, _compiles() - start


@pytest.mark.parametrize("arch", ["dense", "bcmt", "armt"])
def test_compiled_decoding_equals_the_full_forward_and_stops_recompiling(arch):
    same, settled, final = _compiled_decoding(arch, SPAN)
    assert same
    assert final == settled                            # later blocks / segments: no recompile
    longer = _compiled_decoding(arch, 2 * SPAN)        # not one compile per position either
    assert longer == (True, settled, settled)


def test_compiled_step_still_checks_token_ids():
    model = compile_decoding(_model("bcmt"))
    _, state = model.prefill(torch.randint(0, 256, (1, 4)))
    with pytest.raises(ValueError, match="token ids"):
        model.step(torch.tensor([999]), state)


def test_bench_compile_marks_its_records_and_warms_up_across_a_block(monkeypatch):
    compiles_while_timed = []                  # frames compiled during each timed block
    time_interleaved = bench.bench_steps.time_interleaved

    def timed(fns, **kwargs):
        before = _compiles()
        out = time_interleaved(fns, **kwargs)
        compiles_while_timed.append(_compiles() - before)
        return out
    monkeypatch.setattr(bench.bench_steps, "time_interleaved", timed)
    records = bench.run_bench(["bcmt"], [16], d_model=32, n_layer=1, n_head=2, batch=1,
                              threads=1, phases=("decode",), warmup=1, repeats=1,
                              decode_burst=4, memory=("none",), options={"block_size": [8]},
                              progress=False, compile=True)
    # every block starts from a fresh prefill of the same capacity: the graphs compiled in
    # the warm-up serve all of them
    assert compiles_while_timed == [0] * bench.DECODE_BLOCKS
    assert [r["arch"] for r in records] == ["dense", "bcmt"]
    assert all(r["compiled"] and r["compile_warmup_s"] > 0 for r in records)
    assert "compiled (torch.compile)" in bench.format_table(records)
    entries = [bench.Entry("bcmt", "", {}, preset("tiny", arch="bcmt", block_size=8).model)]
    ctx = bench.BenchContext({}, [16], 1, torch.device("cpu"), "fp32", 1, 1, 1, 4, ("none",),
                             False, compile=True)
    assert bench_compile.compile_warmup_calls(ctx, entries) == 3        # (8 + 4) / 4 bursts


def test_bench_rejects_a_non_boolean_compile():
    with pytest.raises(ValueError, match="compile"):
        bench.run_bench(["dense"], [16], compile="yes")


def test_trainer_compiles_when_asked():
    cfg = preset("tiny", steps=2, eval_every=2, batch_size=2, compile=True)
    seqs = torch.randint(0, 256, (8, 17))
    data = TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())
    model = build_model(cfg)
    history = Trainer(model, cfg, data, callbacks=[Callback()]).fit()
    assert history.step == [1, 2] and all(torch.isfinite(torch.tensor(history.loss)))
    assert model._compiled_call_impl is not None                  # model.compile() ran
    with pytest.raises(ValueError, match="compile"):
        TrainConfig(compile="no")


def test_boundary_span_reads_every_mechanisms_fields_tuples_included():
    """The compiled bench warms up across the longest boundary span; CAT's chunk_sizes is a
    tuple (a multi-chunk model's span is its largest chunk)."""
    def span(**settings):
        return bench_compile.boundary_span(preset("tiny", **settings).model)

    assert span(arch="cat", chunk_size=4, chunk_sizes=(4, 8)) == 8
    assert span(arch="cat", chunk_size=4) == 4
    assert span(arch="bcmt", block_size=8) == 8
    assert span(arch="dense") == 0
