"""A session's chunk-KV cache: per-layer K/V buffers with sinks and a ring, their FP8 variant, and
the preallocated slabs they view.
"""
