"""Model zoo: one module per mechanism, all behind ``LanguageModel`` and ``build_model``."""

from blockmem_lite.models import armt, bcmt, cat, dense, moc  # noqa: F401  (importing registers the archs)
from blockmem_lite.models.base import (
    IGNORE_INDEX,
    LanguageModel,
    ModelOutput,
    State,
    available_archs,
    build_model,
    register,
)

__all__ = ["IGNORE_INDEX", "LanguageModel", "ModelOutput", "State", "available_archs",
           "build_model", "register"]
