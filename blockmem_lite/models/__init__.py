"""Model zoo: one module per mechanism, all behind ``LanguageModel`` and ``build_model``.

Importing this package imports every built-in mechanism module, and each one
registers itself (``registry.register``); plugins register the same way.
"""

from blockmem_lite.models import armt, bcmt, cat, dense, moc  # noqa: F401  (each registers itself)
from blockmem_lite.models.base import (
    IGNORE_INDEX,
    LanguageModel,
    ModelOutput,
    State,
    available_archs,
    build_model,
)

__all__ = ["IGNORE_INDEX", "LanguageModel", "ModelOutput", "State", "available_archs",
           "build_model"]
