"""Model zoo: one module per mechanism, all behind ``LanguageModel`` and ``build_model``.

The registrations (``registry.register``) live in ``blockmem_lite.mechanisms``, one
module per mechanism, which ``import blockmem_lite`` imports first; plugins register
the same way.
"""

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
