"""Shared fixtures: deterministic CPU, tiny configs.

Tests use tiny models, which gain nothing from intra-op threads; one thread
keeps them fast and steady on a busy 2-core machine (benchmarks pin their own).
"""

import pytest
import torch

from blockmem_lite import preset

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def tiny_cfg():
    return preset("tiny")
