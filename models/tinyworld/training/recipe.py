"""The tiny-world recipe: pair-wise teacher-forced flow matching, then self-rollout context.

One training step (``TrainConfig`` holds every number):

1. draw a batch of 3-chunk clips from the procedural world (``data.ClipSampler``);
2. pick one target chunk per clip and its clean context (the chunk before it; none for a
   stream's first chunk): mid-stream clips train chunk 1 or 2, stream starts chunk 0, 1 or 2,
   contrast groups (``contrast_p`` of the batch: one context continued under ``contrast``
   different keys, see ``data.py``) chunk 2; the ``ActionProbe`` (``probe.py``) is logged
   every ``probe_every`` steps;
3. noise the target (rectified flow, ``x_t = (1 - s) x0 + s eps``): with probability
   ``discrete_p`` at one of the 4 sigmas the served schedule visits, else uniform;
4. the pair forward (``teacher_forcing``) predicts the target's clean frames against the
   context exactly as the loop's KV update + denoise step would (the DiT is an
   ``PixelDiT``: see ``prediction.py`` for why not the velocity); loss = MSE to ``x0``,
   weighted ``1 + sprite_weight`` within ``sprite_reach_px`` of the context's sprite (where the
   keys move it; ~2 % of a frame is sprite) - a weight that depends on the inputs only, so the
   optimum stays the conditional mean - and masked where the clip's text contradicts the
   target's look (before a prompt switch);
5. phase 2 (from ``self_rollout_from`` of the budget on): for ``self_rollout_p`` of the clips
   whose target is chunk 2, the context is the model's OWN 4-step sample of chunk 1 (drawn with
   the served sampler: x0-prediction, fresh re-noising, against chunk 0), so the model learns to
   continue from what it generates, not only from ground truth (a self-forcing-style rollout
   with a true target); context is also jittered with small Gaussian noise
   (``context_noise``) throughout;
6. AdamW, gradient clipping, warm-up + cosine learning rate over the budget, and an EMA of the
   weights, which is what the checkpoint holds.

The run ends at ``budget_s`` seconds or ``max_steps`` steps, whichever comes first, writes
``tiny-world.safetensors`` and ``train_log.json`` into the output directory and returns the
summary that is stored in the checkpoint's metadata. The EMA weights at the start of phase 2
are kept as ``tiny-world-phase1.safetensors`` (what teacher forcing alone gives), and every
``checkpoint_every_s`` the current EMA weights are written too (a long CPU run can be stopped).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

from models.loops.sampling import SigmaStep, sigma_steps
from models.tinyworld.card import CHECKPOINT_FILE, TRAINING_COMMAND
from models.tinyworld.components import load_checkpoint, new_components, save_checkpoint
from models.tinyworld.geometry import CHUNK_FRAMES, SCHEDULE, SINK_FRAMES, WINDOW_FRAMES
from models.tinyworld.prediction import PixelDiT
from models.tinyworld.text import WordTextEncoder
from models.tinyworld.training.data import ClipSampler
from models.tinyworld.training.pairs import Pair, near_sprite_mask
from models.tinyworld.training.probe import ActionProbe
from models.tinyworld.training.teacher_forcing import pair_prediction

__all__ = ["PHASE1_FILE", "TrainConfig", "TrainGeometryError", "train"]

PHASE1_FILE = "tiny-world-phase1.safetensors"

log = logging.getLogger(__name__)


class TrainGeometryError(ValueError):
    """A KV window the pair forward cannot express (names the frame counts)."""


def _check_geometry() -> None:
    if SINK_FRAMES or WINDOW_FRAMES != 2 * CHUNK_FRAMES:
        raise TrainGeometryError(
            f"window {WINDOW_FRAMES} frames, sink {SINK_FRAMES}: the pair "
            f"recipe needs exactly one cached chunk of {CHUNK_FRAMES}"
        )


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Every number of a run (recorded in the checkpoint). Units: seconds, steps, clips."""

    preset: str = "tinyworld-s"
    batch: int = 128
    num_chunks: int = 3
    height: int = 96
    width: int = 96
    budget_s: float = 400.0
    max_steps: int = 1_000_000
    seed: int = 0
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema: float = 0.999
    discrete_p: float = 0.7
    context_noise: float = 0.05
    sprite_weight: float = 10.0  # extra loss weight near the context's sprite
    sprite_reach_px: int = 24  # how far from the context's sprite that weight reaches
    self_rollout_from: float = 0.6
    self_rollout_p: float = 0.5
    fresh_p: float = 0.25  # share of clips that start a stream (their chunk 0 has no context)
    moving_p: float = 0.6  # share of mid-stream clips that start moving (else at rest)
    hold_p: float = 0.55  # chance a chunk keeps the previous chunk's keys
    contrast: int = 1  # clips per contrast group (same clip, last chunk's keys redrawn)
    contrast_p: float = 0.0  # share of the batch in contrast groups (their target: chunk 2)
    action_lr_mult: float = 1.0  # the action hook's learning rate / lr (no weight decay if != 1)
    probe_every: int = 100  # steps between action probes (0: never)
    probe_pairs: int = 96  # clips drawn for the probe batch (those holding a direction key stay)
    init_from: str | None = None  # a checkpoint to start from (fine-tuning) instead of seeded init
    log_every: int = 50
    checkpoint_every_s: float = 600.0


class StepStats(TypedDict):
    """What one optimizer step reports (averaged over the steps between log records)."""

    loss: torch.Tensor  # the step's loss, detached
    grad_norm: torch.Tensor  # before clipping, detached
    rollout: float  # 1.0 once the run is in its self-rollout phase


class _Run:
    """One training run's modules, optimiser and schedule (no per-step state besides ``n``)."""

    def __init__(self, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        dit, _, text = new_components(cfg.preset, seed=cfg.seed)
        if cfg.init_from is not None:
            start, _, start_text, _ = load_checkpoint(cfg.init_from)
            dit.load_state_dict(start.state_dict())
            text.load_state_dict(start_text.state_dict())
        self.dit: PixelDiT = dit.to(device).train()
        self.text: WordTextEncoder = text.to(device).train()
        self.ema_dit = copy.deepcopy(self.dit).eval().requires_grad_(False)
        self.ema_text = copy.deepcopy(self.text).eval().requires_grad_(False)
        self.params = [*self.dit.parameters(), *self.text.parameters()]
        hook = self.dit.action_embedding
        hook_ids = {id(p) for p in hook.parameters()} if hook is not None else set()
        groups = [{"params": [p for p in self.params if id(p) not in hook_ids], "mult": 1.0}]
        if hook is not None and hook_ids:
            groups.append(
                {
                    "params": list(hook.parameters()),
                    "mult": cfg.action_lr_mult,
                    "weight_decay": cfg.weight_decay if cfg.action_lr_mult == 1.0 else 0.0,
                }
            )
        self.opt = torch.optim.AdamW(
            groups, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay
        )
        self.sampler = ClipSampler(
            num_chunks=cfg.num_chunks,
            chunk_frames=CHUNK_FRAMES,
            height=cfg.height,
            width=cfg.width,
            text_len=self.dit.config.text_len,
            device=device,
            seed=cfg.seed,
            fresh_p=cfg.fresh_p,
            moving_p=cfg.moving_p,
            hold_p=cfg.hold_p,
            contrast=cfg.contrast,
            contrast_p=cfg.contrast_p,
        )
        self.probe = (
            ActionProbe(
                pairs=cfg.probe_pairs,
                height=cfg.height,
                width=cfg.width,
                text_len=self.dit.config.text_len,
                device=device,
                reach_px=cfg.sprite_reach_px,
            )
            if cfg.probe_every
            else None
        )
        self.steps: tuple[SigmaStep, ...] = sigma_steps(
            SCHEDULE.timesteps, SCHEDULE.flow_shift, SCHEDULE.num_train_timesteps
        )
        _check_geometry()
        self.g = torch.Generator(device=device).manual_seed(cfg.seed + 7)
        self.n = 0

    def _randn(self, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(like.shape, generator=self.g, device=self.device, dtype=like.dtype)

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.g, device=self.device)

    def _autocast(self) -> Any:
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
        )

    def _x0(self, pair: Pair, xt: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        # xt: [B, 3, c, H, W]; sigma: [B] -> x0 estimate [B, 3, c, H, W] float32
        with self._autocast():
            x0 = pair_prediction(
                self.dit,
                pair.context,
                xt,
                sigma * SCHEDULE.num_train_timesteps,
                self.text.embed(pair.words),
                pair.has_context,
                action=pair.action,
                action_on=pair.action_on,
                audio=pair.audio,
                audio_on=pair.audio_on,
            )
        return x0.float()

    @torch.no_grad()
    def _own_sample(self, pair: Pair) -> torch.Tensor:
        """The pair's target sampled by the served 4-step sampler -> [B, 3, c, H, W]."""
        x = self._randn(pair.target)
        out = x
        for step in self.steps:
            sigma = torch.full((x.shape[0],), step.sigma, device=self.device)
            out = self._x0(pair, x, sigma)
            x = (
                out
                if step.sigma_next == 0
                else ((1 - step.sigma_next) * out + step.sigma_next * self._randn(out))
            )
        return out.clamp(-1.0, 1.0)

    def _sigmas(self, b: int) -> torch.Tensor:
        table = torch.tensor([s.sigma for s in self.steps], device=self.device)
        discrete = table[torch.randint(len(self.steps), (b,), generator=self.g, device=self.device)]
        uniform = self._rand(b).clamp(0.02, 1.0)
        return torch.where(self._rand(b) < self.cfg.discrete_p, discrete, uniform)

    def lr_at(self, frac: float) -> float:
        warm = min(1.0, (self.n + 1) / self.cfg.warmup_steps)
        return self.cfg.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def step(self, frac: float) -> StepStats:
        cfg = self.cfg
        clips = self.sampler.sample(cfg.batch)
        b = cfg.batch
        target = torch.where(
            clips.fresh,
            torch.randint(3, (b,), generator=self.g, device=self.device),
            1 + torch.randint(2, (b,), generator=self.g, device=self.device),
        )
        target = torch.where(clips.contrast, cfg.num_chunks - 1, target)
        pair = Pair.of(clips, target)
        weight = clips.loss_mask[torch.arange(b, device=self.device), target]
        rollout = frac >= cfg.self_rollout_from
        context = pair.context
        if rollout:
            own = (
                ((target == 2) & (clips.loss_mask[:, 1] > 0) & (self._rand(b) < cfg.self_rollout_p))
                .nonzero()
                .flatten()
            )
            if own.numel():
                first = Pair.of(clips, torch.ones_like(target)).select(own)
                context = context.index_copy(0, own, self._own_sample(first))
        context = (
            context
            + self._randn(context) * (self._rand(b) * cfg.context_noise)[:, None, None, None, None]
        )
        pair = pair.with_context(context)
        sigma = self._sigmas(b)
        s = sigma[:, None, None, None, None]
        xt = (1 - s) * pair.target + s * self._randn(pair.target)
        # weight from the inputs only (the context's sprite, dilated), never from the target:
        # a target-dependent weight would pull uncertain pixels toward the sprite's colour
        pixel_w = 1.0 + cfg.sprite_weight * near_sprite_mask(pair, cfg.sprite_reach_px)
        sq = (self._x0(pair, xt, sigma) - pair.target).square() * pixel_w
        err = sq.mean(dim=(1, 2, 3, 4)) / pixel_w.mean(dim=(1, 2, 3, 4))
        loss = (err * weight).sum() / weight.sum().clamp_min(1.0)
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(frac) * group["mult"]
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self._update_ema()
        self.n += 1
        return {"loss": loss.detach(), "grad_norm": grad_norm.detach(), "rollout": float(rollout)}

    @torch.no_grad()
    def _update_ema(self) -> None:
        decay = min(self.cfg.ema, (1 + self.n) / (10 + self.n))
        for ema, live in ((self.ema_dit, self.dit), (self.ema_text, self.text)):
            torch._foreach_lerp_(
                list(ema.parameters()), [p.detach() for p in live.parameters()], 1.0 - decay
            )


def train(
    cfg: TrainConfig, *, device: str | torch.device, out_dir: str | Path
) -> dict[str, object]:
    """Run the recipe (module docstring); -> the run summary (also in ``train_log.json``)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)
    run = _Run(cfg, dev)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, float]] = []
    probes: list[dict[str, object]] = [_probe_record(run, 0.0)] if run.probe is not None else []
    window: list[StepStats] = []  # what each step returned since the last record
    start = last_save = time.perf_counter()
    frac, phase_saved = 0.0, False
    while run.n < cfg.max_steps:
        elapsed = time.perf_counter() - start
        frac = max(elapsed / cfg.budget_s, run.n / cfg.max_steps)
        if frac >= 1.0:
            break
        if frac >= cfg.self_rollout_from and not phase_saved:
            # the teacher-forced-only weights, kept for the self-rollout ablation
            save_checkpoint(
                out / PHASE1_FILE,
                run.ema_dit,
                run.ema_text,
                {"phase": "teacher_forced", "steps": run.n},
            )
            phase_saved = True
        window.append(run.step(frac))
        if time.perf_counter() - last_save > cfg.checkpoint_every_s:
            save_checkpoint(
                out / CHECKPOINT_FILE,
                run.ema_dit,
                run.ema_text,
                {"phase": "in_progress", "steps": run.n},
            )
            last_save = time.perf_counter()
        if run.n % cfg.log_every == 0 or run.n == cfg.max_steps:
            record = {
                "step": run.n,
                "elapsed_s": round(time.perf_counter() - start, 2),
                "loss": float(torch.stack([w["loss"] for w in window]).mean()),
                "grad_norm": float(torch.stack([w["grad_norm"] for w in window]).mean()),
                "lr": run.lr_at(frac),
                "self_rollout": window[-1]["rollout"],
            }
            records.append(record)
            window.clear()
            log.info(
                "step %(step)d  %(elapsed_s).0fs  loss %(loss).5f  grad %(grad_norm).3f  "
                "lr %(lr).2e  rollout %(self_rollout).0f",
                record,
            )
        if run.probe is not None and run.n % cfg.probe_every == 0:
            probes.append(_probe_record(run, time.perf_counter() - start))
    wall_s = time.perf_counter() - start
    summary = {
        "method": "pair_teacher_forced_flow_matching+self_rollout",
        "command": TRAINING_COMMAND,
        "config": asdict(cfg),
        "steps": run.n,
        "clips_seen": run.n * cfg.batch,
        "wall_s": round(wall_s, 1),
        "final_loss": records[-1]["loss"] if records else None,
        "final_probe": _probe_record(run, wall_s, ema=True) if run.probe is not None else None,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "torch": torch.__version__,
    }
    save_checkpoint(out / CHECKPOINT_FILE, run.ema_dit, run.ema_text, summary)
    (out / "train_log.json").write_text(
        json.dumps({"summary": summary, "log": records, "probe": probes}, indent=1)
    )
    return summary


def _probe_record(run: _Run, elapsed_s: float, *, ema: bool = False) -> dict[str, object]:
    """The action probe (``probe.py``) of the live weights (what the step just changed; the
    EMA lags them by ~1/(1 - ema) steps) or of the EMA weights -> a log record."""
    if run.probe is None:
        raise RuntimeError("the run has no action probe (probe_every is 0)")
    dit, text = (run.ema_dit, run.ema_text) if ema else (run.dit, run.text)
    record: dict[str, object] = {
        "step": run.n,
        "elapsed_s": round(elapsed_s, 2),
        "weights": "ema" if ema else "live",
    }
    record |= run.probe.measure(dit, text)
    log.info(
        "probe step %(step)d  %(weights)s  probe %(probe).2e  rest %(probe_rest).2e  "
        "err %(err_true).4f",
        record,
    )
    return record
