"""blockmem_lite: a notebook-based teaching kit for memory-augmented, long-context Transformers.

Public API (light imports only; plotting, widgets and datasets load lazily)::

    from blockmem_lite import notebook_config, build_model, Trainer, trace

A mechanism of your own plugs in like the built-in ones::

    from blockmem_lite import Mechanism, Options, knob, register_mechanism
    register_mechanism(Mechanism(name="swa", model=MyModel, options=MyOptions, summary="..."))
    # or, from a file: load_plugin("my_mechanism.py")  /  --plugin my_mechanism.py
"""

from blockmem_lite import mechanisms  # noqa: F401  (registers the built-in mechanisms)
from blockmem_lite.config import (
    PRESET_NAMES,
    ModelConfig,
    RunConfig,
    TrainConfig,
    fast_mode,
    notebook_config,
    preset,
)
from blockmem_lite.models import LanguageModel, ModelOutput, State, available_archs, build_model
from blockmem_lite.registry import (
    BenchOption,
    Mechanism,
    Options,
    SpecialBench,
    knob,
    load_plugin,
)
from blockmem_lite.registry import register as register_mechanism
from blockmem_lite.trace import trace

__version__ = "0.1.0"


def __getattr__(name):
    # Trainer pulls in the data stack; import it only when asked for.
    if name == "Trainer":
        from blockmem_lite.train import Trainer

        return Trainer
    raise AttributeError(f"module 'blockmem_lite' has no attribute {name!r}")


__all__ = ["PRESET_NAMES", "BenchOption", "LanguageModel", "Mechanism", "ModelConfig",
           "ModelOutput", "Options", "RunConfig", "SpecialBench", "State", "TrainConfig",
           "Trainer", "available_archs", "build_model", "fast_mode", "knob", "load_plugin",
           "notebook_config", "preset", "register_mechanism", "trace", "__version__"]
