"""Measuring: what a step costs and how close it comes to the machine's bound.

- ``flops``: the dense FLOP pieces every mechanism's model builds on (settings layer:
  the registrations import it, so this package file imports nothing).
- ``metrics``: FLOPs per token via the registry, peak memory, saved tensors
  (a training run's own memory estimate is ``train.memory``).
- ``flopcount``: the analytic FLOP models checked against torch's ``FlopCounterMode``.
- ``roofline``: the machine probes (matmul, copy, launch), one step's operator count and
  the bound they set.
- ``bench``: the same-run benchmark against dense (``python -m blockmem_lite bench``);
  ``bench_steps``: its timing protocol and workloads; ``bench_compile``: its compiled
  entries; ``bench_table``: its records' roofline keys, tables and JSON.
"""
