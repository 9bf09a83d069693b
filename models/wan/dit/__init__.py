"""The Wan2.1 DiT: its hyper-parameters and checkpoint key maps, the transformer, its blocks and
attention layers, RoPE, conditioning, step hooks, residual caches, sequence parallelism, CUDA
graphs and FLOPs.
"""
