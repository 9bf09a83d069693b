"""The DiT's kernels: the self-attention backends ``WanInstance.compile(attention=NAME)`` selects,
other libraries' attention, the Triton FP8 attention and the FP8 linear layers.
"""
