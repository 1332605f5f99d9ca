"""The commands around the teaching core: ``python -m blockmem_lite COMMAND`` (``__main__.py``).

``cli`` (train, bench, reproduce), ``exercises`` (build, check, strip the student notebooks)
and ``grading`` (grade submissions), ``site`` (the static HTML pages), ``envcheck`` (the
environment) and ``gpucheck`` (the GPU-only paths in one short run). Nothing below imports
this layer.
"""
