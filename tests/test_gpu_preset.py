"""The gpu preset and what guards a run on a student's GPU: the training-memory estimate
(checked against a real step on the CPU), the refusal of a run that does not fit, the
precision chosen by the card, the GradScaler's place in the Trainer's step, the preset's
sizes and its offline corpus."""

import re

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import build_model, config, preset
from blockmem_lite.runtime import grad_scaler, resolve_precision
from blockmem_lite.train import Trainer, loop, make_optimizer
from blockmem_lite.train import memory as me
from blockmem_lite.train.optim import count_parameters

SEQ = 32
ESTIMATE_TOLERANCE = 0.10     # |estimate - measured| / measured, activations and total
#                               (measured: within 0.2% in fp32, 3.2% for MoC under bf16)
CUDA = torch.device("cuda")   # a device object only: nothing runs on it here


def small(arch: str, **train):
    """The tiny preset at T=32 with a quiet, short training config."""
    return preset("tiny", arch=arch, seq_len=SEQ,
                  **{"steps": 6, "batch_size": 4, "warmup_steps": 1, "log_every": 100, **train})


def tokens(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, 256, (n, SEQ + 1), generator=g)
    return TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())


def measured_saved_bytes(model: torch.nn.Module, fn) -> tuple[int, object]:
    """(bytes autograd saves while ``fn()`` runs, its result): distinct storages, parameters
    and buffers left out (the test's own count, independent of the library's)."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen, alive = {}, []

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
            alive.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# --- the estimate against a real step --------------------------------------------------------
@pytest.mark.parametrize("arch, precision", [("dense", "fp32"), ("bcmt", "fp32"),
                                             ("cat", "fp32"), ("armt", "fp32"),
                                             ("moc", "fp32"), ("dense", "bf16"),
                                             ("moc", "bf16")])
def test_the_estimate_matches_a_real_training_step(arch, precision):
    """Estimated from batches of 1 and 2; measured at batch 6: the activations autograd
    saves, then the gradients and AdamW's state after a real step."""
    torch.manual_seed(0)
    model = build_model(small(arch))
    x, y = tokens(8).tensors                                              # (8, T) each
    estimate = me.estimate_training_memory(model, x[:2], y[:2], batch_size=6,
                                           precision=precision)
    xb, yb = x[:6], y[:6]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with autocast:
        saved, out = measured_saved_bytes(model, lambda: model(xb, yb))
    optimizer = make_optimizer(model, small(arch).train)
    out.loss.backward()
    optimizer.step()
    gradients = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
    moments = tensor_bytes(v for s in optimizer.state.values() for k, v in s.items()
                           if k != "step")
    weights = tensor_bytes((*model.parameters(), *model.buffers()))
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == \
        (weights, gradients, moments)
    assert estimate.activations == pytest.approx(saved, rel=ESTIMATE_TOLERANCE)
    assert estimate.total == pytest.approx(weights + gradients + moments + saved,
                                           rel=ESTIMATE_TOLERANCE)
    if precision == "bf16":        # autocast's weight copies: fixed, not per sequence
        assert estimate.fixed_activations > 0.4 * weights // 2


def test_the_dry_runs_leave_the_run_and_the_model_alone():
    """CAT's multi-chunk model draws a chunk size per call: with the estimate or without,
    the same losses; the random state and the model's eval mode survive the estimate."""
    cfg = small("cat", chunk_sizes=(4, 8, 16), chunk_size=8)
    histories = []
    for check in (True, False):
        torch.manual_seed(0)
        trainer = Trainer(build_model(cfg), cfg.replace(check_memory=check), tokens(16), None,
                          callbacks=[_Quiet()])
        assert (trainer.memory is not None) == check
        histories.append(trainer.fit().loss)
    assert histories[0] == histories[1]
    model = build_model(cfg).eval()
    data = tokens(2)
    state = torch.get_rng_state()
    me.estimate_training_memory(model, data.tensors[0], data.tensors[1], 4)
    assert torch.equal(torch.get_rng_state(), state) and not model.training


# --- too big: one message, a batch that fits -------------------------------------------------
def test_a_run_that_does_not_fit_is_refused_with_a_batch_that_does(monkeypatch):
    cfg = preset("fast", arch="bcmt", seq_len=SEQ, batch_size=8, steps=3)
    torch.manual_seed(0)
    model = build_model(cfg)
    data = tokens(16)
    estimate = me.estimate_training_memory(model, data.tensors[0][:2], data.tensors[1][:2], 8)
    available = int((estimate.at_batch(3).total + estimate.per_sequence // 2) / me.FIT_FRACTION)
    monkeypatch.setattr(loop, "memory_for_run", lambda model, device: available)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as err:
        Trainer(model, cfg, data, None)
    message = str(err.value)
    assert "\n" not in message and message.startswith("batch_size=8 is not allowed on cpu")
    for part in ("weights", "gradients", "AdamW moments", "activations", "per sequence of 32",
                 "is free there", "the 'tiny' preset", "check_memory=False"):
        assert part in message
    suggested = int(re.search(r"expected batch_size <= (\d+)", message).group(1))
    budget = me.FIT_FRACTION * available
    assert suggested == 3
    assert estimate.at_batch(suggested).total <= budget < estimate.at_batch(suggested + 1).total
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    Trainer(model, cfg.replace(batch_size=suggested), data, None)      # that one fits
    Trainer(model, cfg.replace(check_memory=False), data, None)        # asked to try anyway


def test_dry_runs_out_of_memory_are_refused_and_model_errors_left_to_the_step(monkeypatch):
    cfg = small("dense")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(loop, "estimate_training_memory", out_of_memory)
    with pytest.raises(ValueError, match=r"seq_len=32 is not allowed on cpu: even a dry run"):
        Trainer(build_model(cfg), cfg, tokens(8), None)
    monkeypatch.setattr(loop, "estimate_training_memory", lambda *a, **k: 1 / 0)
    assert Trainer(build_model(cfg), cfg, tokens(8), None).memory is None


def test_not_even_one_sequence_fitting_says_so():
    estimate = me.MemoryEstimate(weights=100, gradients=100, optimizer=200,
                                 fixed_activations=50, per_sequence=1000, batch_size=4,
                                 seq_len=1024, precision="fp16")
    assert estimate.total == 4450 and estimate.largest_batch(1449) == 0
    assert estimate.largest_batch(1450) == 1
    with pytest.raises(ValueError, match=r"batch_size=8 is not allowed on cuda.*even one "
                                         r"sequence does not fit.*check_memory=False"):
        me.check_fits(estimate, 1000, "cuda", world_size=2)
    me.check_fits(estimate, None, "mps")                     # free memory unknown: no check
    me.check_fits(estimate, 4945, "cuda")                    # 90% of it is 4450


# --- precision by the card ------------------------------------------------------------------
@pytest.mark.parametrize("capability, precision, expected", [
    ((7, 5), "auto", "fp16"),        # T4, RTX 20xx
    ((6, 1), "auto", "fp16"),        # GTX 10xx
    ((8, 0), "auto", "bf16"),        # A100
    ((8, 6), "auto", "bf16"),        # RTX 30xx
    ((9, 0), "auto", "bf16"),        # H100
    ((7, 5), "fp32", "fp32"),
    ((8, 0), "fp16", "fp16"),
])
def test_autocast_dtype_follows_the_cards_bf16(capability, precision, expected):
    assert resolve_precision(CUDA, precision, capability=capability) == expected


def test_precision_off_cuda_and_bf16_on_an_old_card():
    assert resolve_precision("cpu") == "fp32" == resolve_precision("mps")
    for asked in ("fp16", "bf16"):
        with pytest.raises(ValueError, match=f"precision='{asked}' is not allowed on cpu"):
            resolve_precision("cpu", asked)
    with pytest.warns(UserWarning, match="emulated"):
        assert resolve_precision(CUDA, "bf16", capability=(7, 5)) == "bf16"
    assert isinstance(grad_scaler("cpu", "fp16"), torch.amp.GradScaler)
    assert grad_scaler("cpu", "bf16") is None and grad_scaler("cpu", "fp32") is None
    with pytest.raises(ValueError, match="precision='fp8'"):
        resolve_precision(CUDA, "fp8", capability=(9, 0))


def test_the_bench_and_the_trainer_share_the_rule_and_say_it(monkeypatch):
    from blockmem_lite import runtime
    from blockmem_lite.measure import bench

    monkeypatch.setattr(runtime, "cuda_capability", lambda device: (7, 5))      # a T4
    assert bench.resolve_dtype("auto", CUDA) == "fp16" == resolve_precision(CUDA)
    assert runtime.precision_note(CUDA, "fp16") == \
        "fp16 autocast with a GradScaler (compute capability 7.5 has no fast bf16)"
    monkeypatch.setattr(runtime, "cuda_capability", lambda device: (8, 9))      # an RTX 40xx
    assert bench.resolve_dtype("auto", CUDA) == "bf16"
    with pytest.raises(ValueError, match="dtype='fp16' is not allowed"):
        bench.resolve_dtype("fp16", torch.device("cpu"))


# --- the GradScaler in the Trainer's step ---------------------------------------------------
class _Quiet:
    def on_step(self, trainer, rec):
        pass


def scaled_trainer(scaler, precision="fp32", steps=6, **train):
    cfg = small("dense", steps=steps, **train)
    torch.manual_seed(0)
    trainer = Trainer(build_model(cfg), cfg, tokens(24), None, callbacks=[_Quiet()])
    trainer.precision, trainer.scaler = precision, scaler       # what a T4 would get
    return trainer


def test_the_scaler_unscales_before_clipping():
    """A fixed power-of-two scale is exact in fp32: scaled, unscaled and clipped, the run
    is the unscaled run's, step for step (clipping does work here)."""
    fixed = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=10 ** 6)
    plain = scaled_trainer(None, grad_clip=0.05)
    scaled = scaled_trainer(fixed, grad_clip=0.05)
    plain_history, scaled_history = plain.fit(), scaled.fit()
    assert min(plain_history.grad_norm) > 0.05
    assert scaled_history.grad_norm == pytest.approx(plain_history.grad_norm, rel=1e-6)
    for a, b in zip(plain.model.parameters(), scaled.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_overflowing_steps_are_skipped_not_failed():
    """A scale too large overflows the first steps: they are skipped (no update) and the
    scale halves until the gradients are finite; then training goes on."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    trainer = scaled_trainer(scaler, steps=8)
    start = [p.detach().clone() for p in trainer.model.parameters()]
    history = trainer.fit()
    skipped = [g for g in history.grad_norm if g != g or g == float("inf")]
    assert 1 <= trainer.skipped_steps == len(skipped) < 8 and len(history.loss) == 8
    assert scaler.get_scale() < 2.0 ** 127
    assert any(not torch.equal(a, b) for a, b in zip(start, trainer.model.parameters(),
                                                     strict=True))


def test_overflow_without_end_fails_the_run():
    scaler = torch.amp.GradScaler("cpu", init_scale=float("inf"))
    trainer = scaled_trainer(scaler, steps=loop.MAX_SKIPPED_IN_A_ROW + 5)
    with pytest.raises(FloatingPointError, match=f"at step {loop.MAX_SKIPPED_IN_A_ROW}/"):
        trainer.fit()


def test_fp16_autocast_with_a_scaler_trains_on_the_cpu():
    """The fp16 path a T4 takes, rehearsed with CPU fp16 autocast."""
    trainer = scaled_trainer(torch.amp.GradScaler("cpu"), precision="fp16", steps=12,
                             lr=1e-2)
    dtypes = set()
    trainer.model.head.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    history = trainer.fit()
    assert dtypes == {torch.float16} and trainer.skipped_steps < 3
    assert sum(history.loss[-3:]) < sum(history.loss[:3])


# --- the preset itself ----------------------------------------------------------------------
GPU_PARAMS_M = {"dense": (14, 15), "honly": (14, 15), "armt": (15, 16.5), "bcmt": (17, 19),
                "cat": (60, 70), "moc": (110, 125)}


@pytest.mark.parametrize("arch", sorted(GPU_PARAMS_M))
def test_gpu_preset_sizes_are_the_documented_ones(arch):
    """Counted on the meta device; within the range, and what config's table says."""
    millions = count_parameters(preset("gpu", arch=arch).model) / 1e6
    low, high = GPU_PARAMS_M[arch]
    assert low <= millions <= high
    table = dict(re.findall(r"^(\w+)\s+([\d.]+)M\s", config.__doc__, flags=re.M))
    stated = table.get(arch, table["dense"] if arch == "honly" else None)
    assert stated is not None and millions == pytest.approx(float(stated), abs=0.05)


def test_gpu_preset_trains_on_the_offline_corpus_unless_asked(monkeypatch):
    from blockmem_lite import corpora

    def no_download(*args, **kwargs):
        raise AssertionError("the gpu preset asked the network for a corpus")

    monkeypatch.setattr(corpora, "_load_dataset", no_download)
    cfg = preset("gpu")
    assert cfg.train.corpus == "offline" and cfg.train.batch_size == 16
    train, _ = corpora.make_loaders(cfg)
    assert train.dataset[0][0].shape == (1024,)
    assert preset("gpu", corpus="wikitext-103").train.corpus == "wikitext-103"


def test_a_plugin_model_is_estimated_like_the_kit_ones():
    """The estimate asks nothing of a mechanism: any LanguageModel works."""
    model = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256))
    x = torch.randint(0, 256, (2, SEQ))
    estimate = me.estimate_training_memory(model, x, x, 4, forward=lambda a, b: model(a))
    assert estimate.per_sequence > 0 and estimate.weights == tensor_bytes(model.parameters())
