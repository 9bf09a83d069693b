"""Step bodies (``runtime.contract.StepOp``) of the Wan loops; they run on the executor thread.

Each op holds references to resident components (weights only) and receives one argument
object per plan. Per-request tensors (latents, K/V caches, decoder caches) travel in the
arguments and are written in place where the docstring says so; ops keep no state between
calls, so interleaving sessions through one op cannot smear state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from models.loops.digests import host_digest
from models.wan.dit.step_hooks import StepHookCall
from models.wan.dit.transformer import CrossKV, WanDiT
from models.wan.kv.cache import ChunkKVCache
from models.wan.vae.autoencoder import video_to_uint8
from models.wan.vae.cache import DecoderCache

if TYPE_CHECKING:
    from models.loops.cfg_branches import CfgBranches

__all__ = [
    "ChunkDenoiseArgs",
    "ChunkDenoiseOp",
    "DecodeArgs",
    "DecodeOp",
    "DeviceFrames",
    "DiffusionStepArgs",
    "DiffusionStepOp",
    "HookedStepOutput",
    "KVWriteArgs",
    "KVWriteOp",
    "LatentCodec",
    "TextEmbedOp",
    "TextEncodeOp",
]


def _noise_like(x: torch.Tensor, seed: int) -> torch.Tensor:
    # Drawn on the CPU from an explicit generator: identical on every device and thread.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32)
    return noise.to(device=x.device, dtype=x.dtype)


class _SoloOp:
    """Base for ops that run one plan at a time (``batchable = False``)."""

    name = "op"
    batchable = False
    spmd = "all"  # every rank runs it (runtime/spmd.py); the leader-only ops say so

    def __call__(self, args: Sequence[Any], *, deterministic: bool = False) -> list[Any]:
        with torch.inference_mode():
            return [self.run(a) for a in args]

    def run(self, arg: Any) -> Any:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


class TextEmbedOp(_SoloOp):
    """Prompt text -> ``[1, L, text_dim]`` embedding (bidirectional jobs feed it to every step)."""

    name = "text_embed"
    spmd = "leader"  # only rank 0 runs it (runtime/spmd.py): no collectives inside

    def __init__(self, encode: Callable[[list[str]], torch.Tensor]) -> None:
        self._encode = encode

    def run(self, text: str) -> torch.Tensor:
        return self._encode([text])


class TextEncodeOp:
    """Prompt text -> cross-attention K/V of every DiT layer.

    ``encode`` maps a list of texts to ``[B, L, text_dim]`` embeddings (it owns the
    content-hash feature cache). Batchable: prompts of several sessions encode as one batch; the
    result of each prompt does not depend on its batch mates (masked encoder, row-wise ops).
    """

    name = "text_encode"
    spmd = "leader"  # only rank 0 runs it (runtime/spmd.py): no collectives inside
    batchable = True

    def __init__(self, encode: Callable[[list[str]], torch.Tensor], dit: WanDiT) -> None:
        self._encode = encode
        self._dit = dit

    def __call__(self, args: Sequence[str], *, deterministic: bool = False) -> list[CrossKV]:
        with torch.inference_mode():
            if deterministic:
                return [self._encode_all([text])[0] for text in args]
            return self._encode_all(list(args))

    def _encode_all(self, texts: list[str]) -> list[CrossKV]:
        embeddings = self._encode(texts)  # [B, L, text_dim]
        cross = self._dit.cross_kv(embeddings)
        # One small host copy per prompt change (the embedding, not the per-layer K/V).
        digests = [host_digest(embeddings[i].cpu()) for i in range(len(texts))]
        if len(texts) == 1:
            return [CrossKV(cross.k, cross.v, digests[0])]
        return [
            CrossKV(cross.k[:, i : i + 1].clone(), cross.v[:, i : i + 1].clone(), digests[i])
            for i in range(len(texts))
        ]


@dataclass(frozen=True, slots=True)
class ChunkDenoiseArgs:
    """One few-step denoising step of a chunk against the session's K/V cache.

    x: [1, C, f, h, w] at noise level ``sigma``; returns x0 re-noised to ``sigma_next`` with
    fresh noise drawn from ``noise_seed`` (x0 itself when ``sigma_next == 0``).
    """

    x: torch.Tensor
    timestep: float
    sigma: float
    sigma_next: float
    noise_seed: int
    init_seed: int | None  # not None: ``x`` is only a shape; start from noise of this seed
    cross: CrossKV
    cache: ChunkKVCache
    frame_start: int
    action: torch.Tensor | None
    audio: torch.Tensor | None
    # a card with ``kv_update = last_step``: the last step writes its input's K/V into ``cache``
    # (in place) and its output (the clean chunk) into ``window`` [1, C, S + W, h, w]
    window: torch.Tensor | None = None


class ChunkDenoiseOp(_SoloOp):
    """Self-Forcing-style step: predict x0 from x_t, re-noise to the next level (with
    ``args.window``: also cache the chunk's K/V in the session's cache, in place).

    Batchable when enabled (``batchable``, off by default: ``WanInstance.batch_sessions``): the
    engine may then hand it several sessions' steps of one shape. Those whose caches
    present the same keys (steady state: every cache full) and that write no K/V run as ONE
    DiT forward (``WanDiT.forward_chunks``: latents stacked, each session's K/V concatenated
    from its slab view, its own timestep, RoPE position, prompt and inputs); the rest run one
    by one.
    ``deterministic=True`` runs every step alone (bit-identical to a batch of one).
    ``batch_forwards`` counts the forwards that ran several sessions' steps, by batch size
    (the warm-up checks its batched stage really batched).
    """

    name = "chunk_step"

    def __init__(self, dit: WanDiT) -> None:
        self._dit = dit
        self.batchable = False
        self.batch_forwards: Counter[int] = Counter()

    def __call__(
        self, args: Sequence[ChunkDenoiseArgs], *, deterministic: bool = False
    ) -> list[torch.Tensor]:
        with torch.inference_mode():
            if deterministic or len(args) == 1:
                return [self.run(a) for a in args]
            groups: dict[tuple, list[int]] = {}
            for i, a in enumerate(args):
                groups.setdefault(_batch_group(a), []).append(i)
            out: list[torch.Tensor | None] = [None] * len(args)
            for key, members in groups.items():
                if key[0] is None or len(members) == 1:  # not batchable: one by one
                    for i in members:
                        out[i] = self.run(args[i])
                    continue
                for i, y in zip(members, self._run_batch([args[i] for i in members]), strict=True):
                    out[i] = y
            return out  # type: ignore[return-value]  # every entry was set: a tensor each

    def run(self, a: ChunkDenoiseArgs) -> torch.Tensor:
        # a.x: [1, C, f, h, w] -> [1, C, f, h, w]
        x = _start(a)
        t = torch.full((x.shape[0],), a.timestep, device=x.device, dtype=torch.float32)
        write = a.window is not None
        v = self._dit.forward_chunk(
            x, t, a.cross, a.cache, a.frame_start, action=a.action, audio=a.audio, write_cache=write
        )
        out = _renoise(a, x, v)
        if a.window is not None:
            _keep_window(a.cache, a.window, ((a.frame_start, out),))
        return out

    def _run_batch(self, batch: list[ChunkDenoiseArgs]) -> list[torch.Tensor]:
        # B sessions' [1, C, f, h, w] -> B x [1, C, f, h, w]
        self.batch_forwards[len(batch)] += 1
        xs = [_start(a) for a in batch]
        x = torch.cat(xs)
        t = torch.tensor([a.timestep for a in batch], device=x.device, dtype=torch.float32)
        cross = CrossKV(
            torch.cat([a.cross.k for a in batch], dim=1),
            torch.cat([a.cross.v for a in batch], dim=1),
        )
        # all or none of them have one (``_batch_group``)
        actions = [a.action for a in batch if a.action is not None]
        audios = [a.audio for a in batch if a.audio is not None]
        action = torch.cat(actions) if actions else None
        audio = torch.cat(audios) if audios else None
        v = self._dit.forward_chunks(
            x,
            t,
            cross,
            [a.cache for a in batch],
            [a.frame_start for a in batch],
            action=action,
            audio=audio,
        )
        return [_renoise(a, xi, v[i : i + 1]) for i, (a, xi) in enumerate(zip(batch, xs))]


def _batch_group(a: ChunkDenoiseArgs) -> tuple:
    """Steps with equal keys may share a forward; ``(None, i)`` never batches (it writes K/V,
    or its cache reads keys under a mask)."""
    prefix = a.cache.prefix_frames
    if a.window is not None or prefix is None:
        return (None, id(a))
    return (
        tuple(a.x.shape),
        prefix,
        a.action is None,
        a.audio is None,
        None if a.audio is None else tuple(a.audio.shape),
    )


def _start(a: ChunkDenoiseArgs) -> torch.Tensor:
    return a.x if a.init_seed is None else _noise_like(a.x, a.init_seed)


def _renoise(a: ChunkDenoiseArgs, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # x, v: [1, C, f, h, w]: x0 = x - sigma * v, re-noised to sigma_next with the step's noise
    x0 = x.float() - a.sigma * v.float()
    if a.sigma_next > 0.0:
        noise = _noise_like(x0, a.noise_seed)
        x0 = (1.0 - a.sigma_next) * x0 + a.sigma_next * noise.float()
    return x0.to(a.x.dtype)


@dataclass(frozen=True, slots=True)
class KVWriteArgs:
    """Run clean frames through the DiT at timestep 0 and write their K/V into ``cache``.

    ``groups`` are (frame_start, latents [1, C, g, h, w]) written in order, each attending to
    what the earlier ones wrote: one group for the KV update of a new chunk, several for a
    re-cache of the whole window under a new prompt (``reset`` first).
    """

    groups: tuple[tuple[int, torch.Tensor], ...]
    cross: CrossKV
    cache: ChunkKVCache
    reset: bool
    window: torch.Tensor  # [1, C, S + W, h, w] clean latents per cache slot, updated in place
    action: torch.Tensor | None = None
    audio: torch.Tensor | None = None


class KVWriteOp(_SoloOp):
    """KV update (one group) and LongLive-style re-cache (reset + every cached frame), written
    into the session's cache and window in place; returns None."""

    name = "kv_write"

    def __init__(self, dit: WanDiT) -> None:
        self._dit = dit

    def run(self, a: KVWriteArgs) -> None:
        if a.reset:
            a.cache.reset()
        for frame_start, latents in a.groups:
            t = torch.zeros((latents.shape[0],), device=latents.device, dtype=torch.float32)
            audio = (
                a.audio if (a.audio is not None and a.audio.shape[1] == latents.shape[2]) else None
            )
            self._dit.forward_chunk(
                latents,
                t,
                a.cross,
                a.cache,
                frame_start,
                action=a.action,
                audio=audio,
                write_cache=True,
            )
        _keep_window(a.cache, a.window, a.groups)


def _keep_window(
    cache: ChunkKVCache, window: torch.Tensor, groups: Sequence[tuple[int, torch.Tensor]]
) -> None:
    """Keep the clean latents of every cached frame, slot for slot, for later re-caches."""
    latents = {start + i: g[:, :, i] for start, g in groups for i in range(g.shape[2])}
    for slot, position in enumerate(cache.slot_positions):
        if position in latents:
            window[:, :, slot].copy_(latents[position])


@dataclass(frozen=True, slots=True)
class DecodeArgs:
    """Decode the next latent frames of a stream (DiT latent space) with its decoder cache,
    which the decode advances in place (buffers and ``frames_seen``).

    ``defer``: the caller can take the frames later (a session's encoder), so an op with
    overlap enabled may return them as ``DeviceFrames`` still being decoded.
    """

    latents: torch.Tensor  # [1, C, c, h, w] DiT-normalised
    cache: DecoderCache
    defer: bool = False


class DeviceFrames:
    """Frames a second CUDA stream is still decoding into pinned host memory
    (``runtime.contract.TimedPendingOutput``): ``result()`` waits for them -> uint8
    [n, H, W, 3]; ``device_s()`` is how long the side stream worked on them (from ``started``,
    recorded on the side stream once it may start, to ``done``)."""

    def __init__(
        self, host: torch.Tensor, done: torch.cuda.Event, started: torch.cuda.Event | None = None
    ) -> None:
        self._host = host
        self._done = done
        self._started = started
        self.shape = host.shape

    def ready(self) -> bool:
        return self._done.query()

    def result(self) -> torch.Tensor:
        self._done.synchronize()
        return self._host

    def device_s(self) -> float | None:
        if self._started is None or not self._done.query():
            return None
        return self._started.elapsed_time(self._done) / 1000.0


class LatentCodec(Protocol):
    """What the loops decode with: ``WanVAE``, ``TAEHVDecoder`` (a tiny streaming decoder) or a
    family's own codec. ``denormalize`` maps DiT latents to the codec's scale (the identity for a
    codec that decodes DiT latents as they are); ``decode_chunk`` returns ``[B, 3, n, H, W]`` in
    [-1, 1] and advances the stream's cache in place."""

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def denormalize(self, z: torch.Tensor) -> torch.Tensor: ...

    def decode_chunk(self, z: torch.Tensor, cache: DecoderCache) -> torch.Tensor: ...

    def new_decoder_cache(
        self, batch_size: int, latent_height: int, latent_width: int
    ) -> DecoderCache: ...

    def decoder_cache_bytes(
        self, batch_size: int, latent_height: int, latent_width: int, dtype: torch.dtype
    ) -> int: ...


class DecodeOp(_SoloOp):
    """Chunked causal decode (the card's codec: VAE or tiny decoder) -> uint8 RGB frames on the
    CPU, [n, H, W, 3].

    With ``overlap`` on (CUDA only; ``WanInstance.compile(overlap_decode=True)``) a deferrable
    decode runs on a second stream: the op returns ``DeviceFrames`` at once and the loop's next
    plans (KV update, the next chunk's steps) run on the main stream beside it. Same kernels,
    same inputs: the frames are bit-identical to the synchronous path's.
    """

    name = "vae_decode"
    spmd = "leader"  # only rank 0 runs it (runtime/spmd.py): no collectives inside

    def __init__(self, vae: LatentCodec) -> None:
        self._vae = vae
        # The VAE's weight dtype; None for a codec without weights (pixel latents).
        self._dtype = next((p.dtype for p in vae.parameters()), None)
        self._stream: torch.cuda.Stream | None = None

    @property
    def overlap(self) -> bool:
        return self._stream is not None

    def set_overlap(self, enabled: bool, device: torch.device) -> None:
        """Decode deferrable chunks on a second stream of ``device`` (no-op off CUDA). Decodes
        still running on the previous stream finish first (they write streams' decoder caches)."""
        if self._stream is not None:
            self._stream.synchronize()
        self._stream = torch.cuda.Stream(device) if enabled and device.type == "cuda" else None

    def run(self, a: DecodeArgs) -> torch.Tensor | DeviceFrames:
        if self._stream is None or not a.defer:
            return self._decode(a).cpu()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream(a.latents.device))  # the latents are written
        with torch.cuda.stream(side):
            started = torch.cuda.Event(enable_timing=True)
            started.record(side)
            frames = self._decode(a)
            host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            host.copy_(frames, non_blocking=True)
            done = torch.cuda.Event(enable_timing=True)
            done.record(side)
        # Tensors made on the main stream and used here must not be recycled before the side
        # stream is done with them (the loop may drop them meanwhile).
        for tensor in (a.latents, *a.cache.buffers):
            tensor.record_stream(side)
        return DeviceFrames(host, done, started)

    def _decode(self, a: DecodeArgs) -> torch.Tensor:
        # -> uint8 [n, H, W, 3] on the VAE's device
        latents = a.latents if self._dtype is None else a.latents.to(self._dtype)
        z = self._vae.denormalize(latents)
        video = self._vae.decode_chunk(z, a.cache)  # [1, 3, n, H, W]
        return video_to_uint8(video[0])


@dataclass(frozen=True, slots=True)
class DiffusionStepArgs:
    """One sampler step over a whole clip with bidirectional attention (jobs of base models).

    x: [1, C, f, h, w]; ``text``/``negative`` are [1, L, text_dim] prompt embeddings
    (``negative`` None or ``guidance_scale == 1``: no CFG; otherwise both branches run as one
    batch of 2 - batched CFG - and combine as ``v_u + s * (v_c - v_u)``).
    """

    x: torch.Tensor
    timestep: float
    sigma: float
    sigma_next: float
    noise_seed: int
    init_seed: int | None  # not None: ``x`` is only a shape; start from noise of this seed
    text: torch.Tensor
    negative: torch.Tensor | None
    guidance_scale: float
    renoise: bool  # True: x0-predict + fresh noise (distilled); False: Euler step along v
    hooks: StepHookCall | None = None  # extensions (models/wan/dit/step_hooks.py); None: plain


@dataclass(frozen=True, slots=True)
class HookedStepOutput:
    """A hooked step's output: the latents and its interceptor's new branch states."""

    latents: torch.Tensor  # [1, C, f, h, w]
    name: str
    branches: dict[str, Any]
    reused: bool


class DiffusionStepOp(_SoloOp):
    """A bidirectional denoising step with classifier-free guidance as a policy (with
    ``hooks``: through the hooked forward, returning a ``HookedStepOutput``)."""

    name = "diffusion_step"

    def __init__(self, dit: WanDiT) -> None:
        self._dit = dit
        # the cfg axis (models/loops/cfg_branches.py): my branch here, the other on a peer rank
        self.branches: CfgBranches | None = None

    def run(self, a: DiffusionStepArgs) -> torch.Tensor | HookedStepOutput:
        # a.x: [1, C, f, h, w] -> [1, C, f, h, w]
        x = a.x if a.init_seed is None else _noise_like(a.x, a.init_seed)
        negative = a.negative if a.guidance_scale != 1.0 else None  # None: no CFG
        if negative is not None and self.branches is not None and a.hooks is None:
            t = torch.full((1,), a.timestep, device=x.device, dtype=torch.float32)
            v = self._dit(x, t, self.branches.text(a.text, negative)).float()
            return self._update(a, x, self.branches.gather(v))  # [2, ...]: both branches
        x_in = x if negative is None else torch.cat((x, x))
        text = a.text if negative is None else torch.cat((a.text, negative))
        t = torch.full((x_in.shape[0],), a.timestep, device=x.device, dtype=torch.float32)
        if a.hooks is not None:
            v, branches, reused = a.hooks.hooks.forward(self._dit, x_in, t, text, a.hooks)
            out = self._update(a, x, v.float())
            return HookedStepOutput(out, a.hooks.name, branches, reused)
        return self._update(a, x, self._dit(x_in, t, text).float())

    def _update(self, a: DiffusionStepArgs, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # x, v: [1 | 2, C, f, h, w] -> the sample at sigma_next [1, C, f, h, w]
        cfg = v.shape[0] == 2
        if cfg:
            v_c, v_u = v[:1], v[1:]
            v = v_u + a.guidance_scale * (v_c - v_u)
        x = x.float()
        if a.renoise:
            x0 = x - a.sigma * v
            if a.sigma_next > 0.0:
                noise = _noise_like(x0, a.noise_seed).float()
                return ((1.0 - a.sigma_next) * x0 + a.sigma_next * noise).to(a.x.dtype)
            return x0.to(a.x.dtype)
        return (x + (a.sigma_next - a.sigma) * v).to(a.x.dtype)
