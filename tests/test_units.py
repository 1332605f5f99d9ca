"""units: the one set of human-readable formatters (bytes, durations, rates, memory)."""

import math

import pytest

from blockmem_lite.units import (
    MEMORY_LABELS,
    human_bytes,
    human_duration,
    human_memory,
    human_rate,
    memory_label,
)


@pytest.mark.parametrize("n, text", [
    (None, "-"), (float("nan"), "-"), (0, "0 B"), (512, "512 B"), (1000, "1000 B"),
    (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (10 * 1024, "10 KiB"),
    (1023.7 * 1024, "1.0 MiB"),                  # rounds up into the next unit
    (412 * 2**20, "412 MiB"), (3 * 2**30, "3.0 GiB"), (5 * 2**40, "5.0 TiB"),
    (-1536, "-1.5 KiB"),
])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("seconds, text", [
    (0, "0:00"), (7, "0:07"), (7.4, "0:07"), (59.6, "1:00"), (725, "12:05"),
    (3723, "1:02:03"), (None, "?"), (math.nan, "?"), (math.inf, "?"), (-1, "?"),
])
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text


@pytest.mark.parametrize("rate, text", [
    (950, "950 tok/s"), (0, "0 tok/s"), (999.6, "1.0k tok/s"), (1234, "1.2k tok/s"),
    (12_345, "12.3k tok/s"), (999_960, "1.00M tok/s"), (1.25e6, "1.25M tok/s"),
    (None, "? tok/s"), (math.nan, "? tok/s"),
])
def test_human_rate(rate, text):
    assert human_rate(rate) == text


def test_memory_labels():
    assert memory_label("process_rss") == "RSS"
    assert memory_label("cuda_max_allocated") == "CUDA peak"
    assert memory_label("rss_subprocess") == "RSS (fresh process)"
    assert memory_label("saved_tensors") == "saved for backward"
    assert memory_label("mps_current_allocated") == "mps current allocated"
    assert memory_label(None) == "" and memory_label("") == ""
    assert set(MEMORY_LABELS) == {"process_rss", "cuda_max_allocated", "rss_subprocess",
                                  "saved_tensors", "model_tensors"}
    assert memory_label("model_tensors") == "model tensors"


def test_human_memory():
    assert human_memory(412 * 2**20, "process_rss") == "412 MiB RSS"
    assert human_memory(1.2 * 2**30, "cuda_max_allocated") == "1.2 GiB CUDA peak"
    assert human_memory(2048, None) == "2.0 KiB"
    assert human_memory(None, "saved_tensors") == "- saved for backward"


@pytest.mark.parametrize("call, name", [
    (lambda: human_bytes("1 MB"), "n='1 MB'"),
    (lambda: human_bytes(True), "n=True"),
    (lambda: human_duration("5"), "seconds='5'"),
    (lambda: human_rate([1.0]), r"tokens_per_s=\[1.0\]"),
    (lambda: memory_label(3), "method=3"),
])
def test_bad_input_is_a_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
