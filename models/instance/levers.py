"""The serving levers of a loaded instance: ``configure`` sets them without compiling anything,
``compile`` sets them and then compiles the DiT blocks and the decoders once, ``seal`` stops
compilation at ready. The levers and their measured effect are in docs/architecture.md §8
("Serving levers"); ``levers`` records what is in force.

A mixin of ``WanInstance`` (``instance/resident.py``): it changes the instance's modules and ops
in place (attention kernels, FP8 linears, the decode ops' second stream, CUDA graphs) and the
card's ``chunk_rollout`` KV update; it holds no state of its own (the flags it sets, ``levers``,
``_compiled`` and ``_fp8``, are the instance's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.card import KVUpdate, ModelCard
from models.card.vocabulary import coerce
from models.compile_guard import CompileGuard
from models.instance.errors import InstanceError
from models.loops.ops import DecodeOp, LatentCodec
from models.precompiled import CompilePool, PoolResult, Region, RegionReport, aot_supported
from models.wan.dit.attention import WanSelfAttention
from models.wan.dit.block import block_dynamic
from models.wan.dit.config import WanDiTConfig
from models.wan.dit.cuda_graphs import ChunkGraphs
from models.wan.dit.transformer import WanDiT
from models.wan.kernels.attention import UnknownBackendError, select_backend
from models.wan.kernels.fp8_linear import quantize_linears
from models.wan.kv.slabs import KVSlabBuffer, SlabGeometry
from models.wan.vae.cache import coder_call, coder_dynamic, decoder_dynamic
from models.wan.vae.coders import Decoder

__all__ = ["InstanceLevers"]


class InstanceLevers:
    """Serving levers of a loaded instance (see the module docstring)."""

    # what it reads and sets of the instance
    card: ModelCard
    dit: WanDiT
    vae: LatentCodec  # the default latent codec
    device: torch.device
    dtype: torch.dtype
    kv_config: WanDiTConfig
    kv_dtype: torch.dtype
    decode_op: DecodeOp
    levers: dict[str, Any]
    compile_guard: CompileGuard
    _other_codecs: dict[str, LatentCodec]
    _other_decode_ops: dict[str, DecodeOp]
    _slab_buffers: dict[SlabGeometry, KVSlabBuffer]
    _compiled: bool
    _fp8: bool
    _regions: list[Region]

    def configure(
        self,
        *,
        attention: str | None = None,
        fp8: str | None = None,
        overlap_decode: bool | None = None,
        cuda_graphs: bool | None = None,
        kv_update: str | None = None,
        kv_cache: str | None = None,
    ) -> None:
        """Set serving levers without compiling anything (each None: left as it is); the
        options and their measured effect are in docs/architecture.md ("Serving levers").

        ``attention``: a name of ``models.wan.kernels.attention.ATTENTION_BACKENDS`` (unknown:
        ``InstanceError``; lossy ones fall back to SDPA, logged, where they cannot run).
        ``fp8``: "row" | "tensor" FP8 linears in the blocks (one-way). ``overlap_decode``: VAE
        decode on a second CUDA stream. ``cuda_graphs``: steady-state chunk forwards replay CUDA
        graphs (``models/wan/dit/cuda_graphs.py``; a no-op off CUDA). ``kv_update``: "last_step"
        folds the KV-update pass into the last denoising step, "clean" is the separate pass
        (a deviation from a recipe trained the other way). ``kv_cache``: "fp8" stores the
        chunk-K/V cache in e4m3 with per-head scales, read by FA3's FP8 kernel where it runs
        (``models/wan/kv/fp8.py``; before any slab is reserved), "model" in the model's dtype.
        ``levers`` records what is in force.
        """
        if attention is not None:
            try:
                kernel = select_backend(attention)
            except UnknownBackendError as exc:
                raise InstanceError(exc.args[0]) from None
            for module in self.dit.modules():
                if isinstance(module, WanSelfAttention):
                    module.kernel = kernel
            self.levers["attention"] = kernel.name
            for region in self._regions:  # a compiled graph may hold the kernel it traced
                region.reset()
        if overlap_decode is not None:
            for op in self._other_decode_ops.values():
                op.set_overlap(overlap_decode, self.device)
            self.decode_op.set_overlap(overlap_decode, self.device)
            self.levers["overlap_decode"] = self.decode_op.overlap
        if fp8 not in (None, "row", "tensor"):
            raise InstanceError(f"fp8 {fp8!r} is not one of None, 'row', 'tensor'")
        if fp8 is not None and not self._fp8:
            quantize_linears(
                self.dit, lambda name: name.startswith("blocks."), per_tensor=fp8 == "tensor"
            )
            self._fp8 = True
            self.levers["fp8"] = fp8
        if cuda_graphs is not None:
            self.dit.chunk_graphs = ChunkGraphs() if cuda_graphs else None
            self.levers["cuda_graphs"] = cuda_graphs
        if kv_update is not None:
            self._set_kv_update(kv_update)
        if kv_cache is not None:
            self._set_kv_cache(kv_cache)

    def _set_kv_cache(self, kv_cache: str) -> None:
        dtypes = {"model": self.dtype, "fp8": torch.float8_e4m3fn}
        if kv_cache not in dtypes:
            raise InstanceError(f"kv_cache {kv_cache!r} is not one of {sorted(dtypes)}")
        if dtypes[kv_cache] == self.kv_dtype:
            return
        if self._slab_buffers:
            raise InstanceError("kv_cache must be set before K/V slabs are reserved")
        if kv_cache == "fp8" and self.kv_config is not self.dit.config:
            raise InstanceError("an FP8 K/V cache is not built for sequence-parallel serving")
        self.kv_dtype = dtypes[kv_cache]
        self.levers["kv_cache"] = kv_cache

    def _set_kv_update(self, kv_update: str) -> None:
        spec = self.card.loops.get("chunk_rollout")
        if spec is None:
            raise InstanceError(f"card {self.card.model_id!r} has no chunk_rollout to fold")
        try:
            spec = dataclasses.replace(spec, kv_update=coerce(KVUpdate, kv_update, "kv_update"))
        except ValueError as exc:
            raise InstanceError(f"kv_update {kv_update!r}: {exc}") from None
        loops = {**self.card.loops, "chunk_rollout": spec}
        self.card = dataclasses.replace(self.card, loops=loops)
        self.levers["kv_update"] = spec.kv_update.value

    def compile(
        self,
        *,
        attention: str = "auto",
        fp8: str | None = None,
        overlap_decode: bool = True,
        cuda_graphs: bool = False,
        kv_update: str | None = None,
        kv_cache: str | None = None,
    ) -> None:
        """Optimise the step bodies for serving (GPU; infra/bench/RESULTS.md): ``configure``
        the levers, then (once) make the DiT blocks and the decoders precompiled regions
        (``models.precompiled``: one graph for all blocks per chunk shape, the K/V past length
        symbolic; per decoder one per chunk shape, the grid symbolic and the VAE's frame count
        too above one; kept in the compile cache once ``use_precompiled`` names it). Torch
        without ``aot_compile`` compiles the same modules just in time (``module.compile()``).
        3D conv weights become channels-last (cuDNN's fast layout once the norms around them
        are fused; a tiny decoder's 2D convolutions keep theirs - ``dreamrt bench
        tiny-decoder`` measures both). The first chunks after this pay the compilation.
        Compilation and FP8 are one-way."""
        self.configure(
            attention=attention,
            fp8=fp8,
            overlap_decode=overlap_decode,
            cuda_graphs=cuda_graphs,
            kv_update=kv_update,
            kv_cache=kv_cache,
        )
        if self._compiled:
            return
        for codec in (self.vae, *self._other_codecs.values()):
            if isinstance(codec, torch.nn.Module) and isinstance(
                getattr(codec, "decoder", None), torch.nn.Module
            ):
                for module in codec.modules():
                    if isinstance(module, torch.nn.Conv3d):
                        module.weight.data = module.weight.data.contiguous(
                            memory_format=torch.channels_last_3d
                        )
        if aot_supported():
            self._regions = self._precompiled_regions()
        else:  # torch < 2.10: Dynamo just in time (every start traces again)
            for module, name in self._compiled_modules():
                module.compile()
                self.compile_guard.wrap(module, name)
        self._compiled = True
        self.levers["compiled"] = True

    def _compiled_modules(self) -> list[tuple[torch.nn.Module, str]]:
        """What ``compile`` compiles: every DiT block (one name: a shape counts once) and each
        codec's decoder."""
        modules: list[tuple[torch.nn.Module, str]] = [(b, "dit.blocks") for b in self.dit.blocks]
        for name, codec in (("vae", self.vae), *self._other_codecs.items()):
            if hasattr(codec, "decoder") and isinstance(codec.decoder, torch.nn.Module):
                modules.append((codec.decoder, f"{name}.decoder"))
        return modules

    def _precompiled_regions(self) -> list[Region]:
        """One region for all DiT blocks (the K/V past length and a batch above one symbolic:
        ``block_dynamic``), one per decoder (``models.precompiled``)."""
        blocks = list(self.dit.blocks)
        regions = [
            Region(
                "dit.blocks",
                type(blocks[0]).forward,
                blocks,
                self.compile_guard,
                dynamic=block_dynamic,
            )
        ]
        for module, name in self._compiled_modules()[len(blocks) :]:
            regions.append(
                Region(
                    name,
                    type(module).forward,
                    [module],
                    self.compile_guard,
                    dynamic=decoder_dynamic if isinstance(module, Decoder) else coder_dynamic,
                    adapt=coder_call,
                )
            )
        return regions

    def use_precompiled(self, directory: Path) -> dict[str, int]:
        """Keep the compiled regions' artifacts in ``directory`` (the compile cache's, for this
        card, device and levers) and load those already there -> artifacts loaded per region.
        A no-op on an instance compiled just in time or not at all."""
        return {region.name: region.use_store(directory) for region in self._regions}

    def defer_compiles(self, pool: CompilePool | None) -> None:
        """Hand the precompiled regions' new signatures to ``pool`` (``Region.defer``: the
        calls run eagerly meanwhile); None: compile them here again."""
        for region in self._regions:
            region.defer(pool)

    def collect_compiles(self, results: Sequence[PoolResult]) -> int:
        """Load what ``pool`` compiled into the regions (``Region.collect``) -> graphs."""
        return sum(region.collect(results) for region in self._regions)

    def compile_stats(self) -> dict[str, RegionReport]:
        """What the precompiled regions did in this process: per region, signatures served,
        artifacts compiled and loaded, seconds, eager calls after the seal, fallbacks to JIT."""
        return {region.name: region.report() for region in self._regions}

    def seal(self, *, enforce: bool = True) -> None:
        """At ready, after the warm-up: compile and capture nothing more; a call outside the
        compiled set runs eagerly, logged once and counted (``models.compile_guard``).
        ``enforce=False`` (no warm-up ran): only count what still compiles. A no-op uncompiled."""
        if self._compiled:
            graphs = self.dit.chunk_graphs
            self.compile_guard.seal(
                graphs if isinstance(graphs, ChunkGraphs) else None, enforce=enforce
            )

    def compiles_after_ready(self) -> dict[str, int]:
        """``CompileGuard.after_ready`` (all zero on an uncompiled or unsealed instance)."""
        return self.compile_guard.after_ready()
