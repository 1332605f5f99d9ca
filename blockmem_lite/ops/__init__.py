"""Kernels with alternatives, each beside its plain form (as flash-linear-attention's
``naive.py`` sits beside its kernels): a model calls the fast form, and tests prove
forward and gradients equal to the plain one. Files by mechanism: its kernels (for CAT
also ``cat_layout``, the slot arithmetic the kernels share with the model); this package
imports only torch and the primitives below it (units, validation, nn, masks, trace),
never a model.
"""
