"""The built-in mechanisms' registrations: one module per mechanism, each ending in ``register``.

``models/<name>.py`` holds what the paper defines (options, maths, layer, LM, reference
forward); ``mechanisms/<name>.py`` holds what the kit needs to run it: its FLOP model,
``state_bytes``, bench variants and special benches. Importing this package registers
every built-in mechanism; ``import blockmem_lite`` does it first.
"""

from blockmem_lite.mechanisms import armt, bcmt, cat, dense, moc  # noqa: F401  (each registers)
