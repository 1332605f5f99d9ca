"""CAT in the bench: variants by chunk size and decoder width, decode state vs dense."""

from blockmem_lite import registry
from blockmem_lite.measure import bench
from blockmem_lite.tools.bench_command import bench_options_of, bench_parser

TINY = dict(d_model=32, n_layer=2, n_head=2, batch=1, threads=1, warmup=1, repeats=1,
            decode_burst=4, progress=False, memory=("none",))


def test_cat_variants_ratios_and_state_against_dense_in_one_run():
    records = bench.run_bench(["dense", "cat"], [64], options={"chunk_size": [4, 8],
                                                                "decoder_width": [1, 2]}, **TINY)
    cat = [r for r in records if r["arch"] == "cat"]
    assert {r["variant"] for r in cat} == {"C=4 w=1", "C=8 w=1", "C=4 w=2", "C=8 w=2"}
    assert {r["phase"] for r in cat} == {"train", "decode"}
    for r in cat:
        assert r["ratio_vs_dense"] > 0 and r["flop_ceiling"] > 0
    dense_state = next(r["state_bytes"] for r in records
                       if r["arch"] == "dense" and r["phase"] == "decode")
    for r in cat:
        if r["phase"] != "decode":
            continue
        c, w = r["overrides"]["chunk_size"], r["overrides"]["decoder_width"]
        # (t/C + C)·D vs t·d: docs/MEASUREMENTS.md, The FLOP model
        analytic = (64 / c + c) * w / 64
        ratio = r["state_bytes"] / dense_state
        assert 0.9 * analytic <= ratio <= 1.1 * analytic, (r["variant"], ratio, analytic)


def test_cat_cli_options_are_listed_and_parsed():
    parser = bench_parser()
    help_text = parser.format_help()
    assert "--chunk-size" in help_text and "--decoder-width" in help_text
    args = parser.parse_args(["--arch", "dense,cat", "--chunk-size", "16", "--decoder-width", "1"])
    assert registry.bench_variants("cat", bench_options_of(args)) == [
        ("C=16 w=1", {"chunk_size": 16, "decoder_width": 1})]


def test_decode_process_peak_stays_near_weights_and_state_and_below_dense():
    """Peak RSS of a fresh process per configuration, as the bench measures it: prefill of
    T tokens then decoding. CAT reads the prompt block by block, so its peak barely grows
    from T = 256 to T = 4096 (the one-shot prefill added ~330 MiB at C = 16) and stays
    below dense's, whose KV cache and prefill grow with T."""
    run = dict(d_model=256, n_layer=4, n_head=4, batch=1, threads=1, warmup=1, repeats=1,
               decode_burst=2, progress=False, memory=("rss",), phases=("decode",),
               options={"chunk_size": [16], "decoder_width": [1]})
    short, long = (bench.run_bench(["dense", "cat"], [t], **run) for t in (256, 4096))
    peak = {(r["arch"], r["seq_len"]): r for r in short + long}
    for r in peak.values():
        assert r["memory_method"] == "rss_subprocess"
    assert peak["cat", 4096]["rss_peak_bytes"] < peak["dense", 4096]["rss_peak_bytes"]
    growth = {arch: bench.rss_delta(peak[arch, 4096]) - bench.rss_delta(peak[arch, 256])
              for arch in ("cat", "dense")}
    assert growth["cat"] < 48 * 2 ** 20 < growth["dense"], growth


def test_a_multi_chunk_model_is_benched_at_each_records_chunk_size():
    """The lab benches one multi-chunk model at every C; training draws a C per call, so the
    bench pins it: each record measures its own C, every time, and the saved activations
    fall as C grows (fewer slots: T (1 + 1/C), and fewer chunk vectors to attend)."""
    import dataclasses

    from blockmem_lite import preset
    from blockmem_lite.measure import bench_steps, metrics
    from blockmem_lite.models.base import build_model

    base = dataclasses.replace(preset("fast", arch="cat").model, d_model=32, n_layer=2,
                               n_head=2, seq_len=128, chunk_sizes=(4, 8, 16, 32))
    saved = []
    for c in (4, 8, 16, 32):
        cfg = dataclasses.replace(base, chunk_size=c)
        model = bench_steps.prepared_for_bench(build_model(cfg), cfg)
        assert model.training_chunk_size == c
        forward = bench_steps.make_train_forward(model, 2, 128)
        readings = {metrics.saved_tensor_bytes(forward, exclude=model.parameters())
                    for _ in range(3)}
        assert len(readings) == 1, (c, readings)           # no chunk size drawn per call
        saved.append(readings.pop())
    assert saved == sorted(saved, reverse=True) and saved[0] > saved[-1], saved
    unpinned = build_model(dataclasses.replace(base, chunk_size=4))
    unpinned.train()
    drawn = {unpinned._pick_chunk_size(None) for _ in range(64)}
    assert drawn == {4, 8, 16, 32}                         # the paper's recipe, unchanged
