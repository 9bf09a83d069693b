"""Analytic matmul FLOPs of the Wan DiT (the cost model's prior, MFU in the benchmarks)."""

from __future__ import annotations

from models.wan.dit.config import WanDiTConfig

__all__ = ["dit_flops"]


def dit_flops(
    config: WanDiTConfig,
    tokens_q: int,
    tokens_kv: int,
    text_len: int,
    *,
    batch: int = 1,
    include_text: bool = False,
) -> float:
    """Matmul FLOPs (2*m*n*k each) of one forward over ``tokens_q`` query tokens.

    ``tokens_kv`` is how many keys self-attention sees (cached + own; = ``tokens_q`` for a
    bidirectional forward). Cross-attention K/V and the text embedding are counted only with
    ``include_text`` (they are computed once per prompt). Elementwise work is not counted.
    """
    d, pv = config.dim, config.patch_volume
    per_layer = (
        4 * 2 * tokens_q * d * d  # self q, k, v, o
        + 2 * 2 * tokens_q * tokens_kv * d  # self QK^T and AV over all heads
        + 2 * 2 * tokens_q * d * d  # cross q, o
        + 2 * 2 * tokens_q * text_len * d  # cross QK^T and AV
        + 2 * 2 * tokens_q * d * config.ffn_dim  # FFN up and down
    )
    total = config.num_layers * per_layer
    total += 2 * tokens_q * d * config.in_channels * pv  # patch embedding
    total += 2 * tokens_q * d * config.out_channels * pv  # head
    total += 2 * d * (config.freq_dim + d + 6 * d)  # time embedding + projection
    if include_text:
        total += 2 * text_len * d * (config.text_dim + d)  # text embedding
        total += config.num_layers * 2 * 2 * text_len * d * d  # cross k, v
    return float(batch * total)
