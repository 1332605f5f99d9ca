"""Measuring: what a step costs and how close it comes to the machine's bound.

- ``flops``: the dense FLOP pieces every mechanism's model builds on (settings layer:
  the registrations import it, so this package file imports nothing).
- ``metrics``: FLOPs per token via the registry, parameters, peak memory, saved tensors.
- ``roofline``: the machine probes (matmul peak, copy bandwidth) and the traffic model.
- ``bench``: the same-run benchmark against dense (``python -m blockmem_lite bench``).
"""
