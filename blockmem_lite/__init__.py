"""blockmem_lite: a notebook-based teaching kit for memory-augmented, long-context Transformers.

Public API (light imports only; plotting, widgets and datasets load lazily)::

    from blockmem_lite import notebook_config, build_model, Trainer, trace
"""

from blockmem_lite.config import (
    PRESET_NAMES,
    ModelConfig,
    RunConfig,
    TrainConfig,
    fast_mode,
    notebook_config,
    preset,
)
from blockmem_lite.models import LanguageModel, ModelOutput, available_archs, build_model
from blockmem_lite.trace import trace

__version__ = "0.1.0"


def __getattr__(name):
    # Trainer pulls in the data stack; import it only when asked for.
    if name == "Trainer":
        from blockmem_lite.train import Trainer

        return Trainer
    raise AttributeError(f"module 'blockmem_lite' has no attribute {name!r}")


__all__ = ["PRESET_NAMES", "LanguageModel", "ModelConfig", "ModelOutput", "RunConfig",
           "TrainConfig", "Trainer", "available_archs", "build_model", "fast_mode",
           "notebook_config", "preset", "trace", "__version__"]
