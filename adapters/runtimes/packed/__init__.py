"""The ``packed`` runtime for the Qwen3 family: varlen steps, continuous batching, several devices.

``forward`` (one model replica, packed forward), ``kernels`` (its attention and pointwise
kernels), ``scheduler`` (one queue, one worker thread per device), ``engine`` (the :class:`adapters.base.RerankEngine`). Imported through the registry only.
"""
