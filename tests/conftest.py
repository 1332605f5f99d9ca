"""Shared fixtures: deterministic CPU, tiny configs."""

import pytest
import torch

from blockmem_lite import preset


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def tiny_cfg():
    return preset("tiny")
