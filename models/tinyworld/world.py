r"""The procedural tiny world: a sprite on a terrain, steered by keys, pulsing with audio.

Deterministic by seed, pure torch, batched (the trainer renders thousands of frames per step on
the GPU with the same functions the ``World`` class uses on the CPU)::

    +--------------------------------+   background: the prompt's terrain (fixed texture per
    |  terrain texture       (walls) |   terrain), darkened at night
    |                                |   sprite: the prompt's colour and shape, a darker rim,
    |            /\                  |   radius pulsing with audio energy (up to +45 %)
    |           /__\  -> velocity    |   motion per frame: v <- friction * v + accel * dir(keys)
    |                                |                     p <- clamp(p + v) inside the walls
    +--------------------------------+   (a wall zeroes the velocity component it stops)

Units: positions and velocities in pixels (per frame) of a ``height``-pixel frame, scaled from a
96-pixel reference so every resolution shows the same world. Keys follow
``models.loops.inputs.ACTION_KEYS`` (w a s d = up/left/down/right, shift = sprint; the rest and
the mouse have no effect). No keys = drift to rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.loops.inputs import ACTION_KEYS, normalize_keys
from models.tinyworld.vocab import COLOURS, SHAPES, TERRAINS, WorldSpec, parse_prompt

__all__ = [
    "PHYSICS",
    "SPRITE_RGB",
    "TERRAIN_RGB",
    "Physics",
    "World",
    "action_direction",
    "audio_energy",
    "backgrounds",
    "render_frames",
    "render_layers",
    "simulate",
    "start_position",
    "terrain_textures",
]

# Base colours (RGB in [0, 1]) chosen so every sprite colour stands out on every terrain.
TERRAIN_RGB = torch.tensor(
    [
        [0.28, 0.56, 0.22],  # grass
        [0.82, 0.72, 0.47],  # sand
        [0.12, 0.33, 0.62],  # water
        [0.74, 0.82, 0.92],  # snow
        [0.47, 0.47, 0.50],  # stone
    ]
)
SPRITE_RGB = torch.tensor(
    [
        [0.93, 0.16, 0.12],  # red
        [0.30, 0.95, 0.30],  # green
        [0.20, 0.40, 1.00],  # blue
        [1.00, 0.88, 0.15],  # yellow
        [1.00, 1.00, 1.00],  # white
        [0.62, 0.22, 0.92],  # purple
    ]
)
NIGHT_SCALE = 0.28
NIGHT_TINT = (0.01, 0.02, 0.07)
RIM_SCALE = 0.55  # the sprite's outer rim, as a fraction of its colour
RIM_PX = 1.0
_REFERENCE_PX = 96.0

if len(TERRAIN_RGB) != len(TERRAINS) or len(SPRITE_RGB) != len(COLOURS) or len(SHAPES) != 3:
    raise RuntimeError("tiny-world palette and vocabulary are out of step")


@dataclass(frozen=True, slots=True)
class Physics:
    """Motion and size constants, in pixels of a 96-pixel-high frame (scaled to others)."""

    accel_px: float = 0.6  # per frame^2 while a direction key is held
    sprint: float = 1.7  # accel multiplier while shift is held
    friction: float = 0.8  # velocity kept per frame (terminal speed accel / (1 - friction))
    radius_px: float = 9.0  # sprite radius at silence
    pulse: float = 0.45  # extra radius at full audio energy, as a fraction
    # start position: centre +- this fraction of the frame, drawn from the seed. 0: a stream
    # always starts at the centre, so its first chunk (no context to tell where the sprite
    # is) is a deterministic function of the prompt, which a 4-step sampler renders sharply.
    start_jitter: float = 0.0


PHYSICS = Physics()


# --------------------------------------------------------------------------------------------
# inputs -> forces


def action_direction(action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Action vectors -> unit direction and sprint flag.

    action: [..., ACTION_DIM] (``models.loops.inputs.action_vector`` layout)
    -> dir [..., 2] (x right, y down; zero when no direction key), sprint [...] float 0/1
    """
    w, a, s, d = (action[..., ACTION_KEYS.index(k)] for k in ("w", "a", "s", "d"))
    vec = torch.stack((d - a, s - w), dim=-1)
    norm = vec.norm(dim=-1, keepdim=True).clamp_min(1.0)
    return vec / norm, action[..., ACTION_KEYS.index("shift")]


def audio_energy(features: torch.Tensor) -> torch.Tensor:
    """Audio features of a frame -> pulse energy in [0, 1] (0 for silence and faint noise).

    features: [..., AUDIO_DIM] (``models.loops.inputs.audio_features``: log1p(100 rms)) -> [...]
    """
    return ((features.mean(dim=-1) - 0.5) / 3.0).clamp(0.0, 1.0)


# --------------------------------------------------------------------------------------------
# motion


def _scale(height: int) -> float:
    return height / _REFERENCE_PX


def start_position(
    seeds: torch.Tensor, height: int, width: int, physics: Physics = PHYSICS
) -> torch.Tensor:
    """Seeded start positions near the centre. seeds: [B] int64 -> [B, 2] (x, y) pixels."""
    out = torch.empty((seeds.shape[0], 2), dtype=torch.float32)
    for i, seed in enumerate(seeds.tolist()):
        g = torch.Generator().manual_seed(int(seed))
        out[i] = (torch.rand(2, generator=g) * 2.0 - 1.0) * physics.start_jitter
    out[:, 0] = width / 2.0 + out[:, 0] * height
    out[:, 1] = height / 2.0 + out[:, 1] * height
    return out.to(seeds.device)


def simulate(
    pos: torch.Tensor,
    vel: torch.Tensor,
    direction: torch.Tensor,
    sprint: torch.Tensor,
    height: int,
    width: int,
    physics: Physics = PHYSICS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advance F frames. Frame f shows the position after its own step.

    pos, vel: [B, 2]; direction: [B, F, 2]; sprint: [B, F]
    -> positions [B, F, 2], final pos [B, 2], final vel [B, 2]
    """
    k = _scale(height)
    margin = physics.radius_px * k + 2.0
    low = torch.tensor([margin, margin], device=pos.device)
    high = torch.tensor([width - margin, height - margin], device=pos.device)
    out = []
    for f in range(direction.shape[1]):
        accel = physics.accel_px * k * (1.0 + (physics.sprint - 1.0) * sprint[:, f : f + 1])
        vel = vel * physics.friction + accel * direction[:, f]
        moved = pos + vel
        pos = torch.maximum(torch.minimum(moved, high), low)
        vel = torch.where(pos != moved, torch.zeros_like(vel), vel)
        out.append(pos)
    return torch.stack(out, dim=1), pos, vel


# --------------------------------------------------------------------------------------------
# rendering


def terrain_textures(height: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The fixed look of every terrain: [len(TERRAINS), 3, H, W] RGB in [0, 1]."""
    k = _REFERENCE_PX / height
    y = torch.arange(height, dtype=torch.float32)[:, None] * k
    x = torch.arange(width, dtype=torch.float32)[None, :] * k
    g = torch.Generator().manual_seed(1234)  # fixed: the texture belongs to the terrain
    smooth = torch.nn.functional.interpolate(
        torch.randn((len(TERRAINS), 1, 7, 7), generator=g),
        size=(height, width),
        mode="bicubic",
        align_corners=True,
    )[:, 0]  # [T, H, W]
    speckle = torch.rand((len(TERRAINS), height, width), generator=g) - 0.5
    shade = torch.stack(
        [
            0.05 * smooth[0] + 0.04 * speckle[0],  # grass: patchy, grainy
            0.03 * torch.sin((x + y) * 0.35) + 0.03 * speckle[1],  # sand: ripples
            0.05 * torch.sin(y * 0.45 + 1.5 * torch.sin(x * 0.12)) + 0.01 * smooth[2],  # water
            0.025 * smooth[3],  # snow: nearly flat
            0.03 * smooth[4] - 0.08 * _grout(x, y),  # stone: tiles
        ]
    )  # [T, H, W]
    tex = TERRAIN_RGB[:, :, None, None] + shade[:, None]
    return tex.clamp(0.0, 1.0).to(device)


def _grout(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # x: [1, W], y: [H, 1] (reference pixels) -> [H, W] 1 on tile seams, staggered rows
    row = torch.floor(y / 16.0)
    xs = x + 8.0 * (row % 2)
    on_row = (y % 16.0) < 1.5
    on_col = (xs % 16.0) < 1.5
    return (on_row | on_col).float()


def backgrounds(textures: torch.Tensor, terrain: torch.Tensor, night: torch.Tensor) -> torch.Tensor:
    """textures: [T, 3, H, W]; terrain: [...] long; night: [...] bool -> [..., 3, H, W]."""
    base = textures[terrain]
    tint = torch.tensor(NIGHT_TINT, device=base.device)[:, None, None]
    dark = base * NIGHT_SCALE + tint
    return torch.where(night[..., None, None, None], dark, base)


def _sdf(shape: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    # shape: [N]; dx, dy: [N, H, W] pixel offsets from the centre (y down); r: [N] -> sdf [N, H, W]
    r = r[:, None, None]
    ball = (dx.square() + dy.square()).sqrt() - r
    square = torch.maximum(dx.abs(), dy.abs()) - 0.85 * r
    # equilateral triangle pointing up (Inigo Quilez's exact SDF), half-side 1.3 r, y up
    k, h = math.sqrt(3.0), 1.3 * r
    px, py = dx.abs() - h, -dy + h / k
    flip = px + k * py > 0
    px, py = torch.where(flip, (px - k * py) / 2, px), torch.where(flip, (-k * px - py) / 2, py)
    px = px - torch.maximum(torch.minimum(px, torch.zeros_like(px)), -2 * h)
    triangle = -(px.square() + py.square()).sqrt() * torch.sign(py)
    s = shape[:, None, None]
    return torch.where(s == 0, ball, torch.where(s == 1, square, triangle))


def render_frames(
    textures: torch.Tensor,
    terrain: torch.Tensor,
    night: torch.Tensor,
    colour: torch.Tensor,
    shape: torch.Tensor,
    pos: torch.Tensor,
    energy: torch.Tensor,
    physics: Physics = PHYSICS,
) -> torch.Tensor:
    """Frames of the world, RGB in [0, 1].

    textures: [T, 3, H, W]; terrain, colour, shape: [B, F] long; night: [B, F] bool;
    pos: [B, F, 2] (x, y) pixels; energy: [B, F] audio energy in [0, 1] -> [B, F, 3, H, W]
    """
    return render_layers(textures, terrain, night, colour, shape, pos, energy, physics)[0]


def render_layers(
    textures: torch.Tensor,
    terrain: torch.Tensor,
    night: torch.Tensor,
    colour: torch.Tensor,
    shape: torch.Tensor,
    pos: torch.Tensor,
    energy: torch.Tensor,
    physics: Physics = PHYSICS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``render_frames`` plus the sprite's coverage: -> frames [B, F, 3, H, W], alpha
    [B, F, H, W] in [0, 1] (the trainer weights sprite pixels by it)."""
    b, f = terrain.shape
    height, width = textures.shape[-2:]
    dev = textures.device
    bg = backgrounds(textures, terrain.flatten(), night.flatten())  # [N, 3, H, W]
    ys = torch.arange(height, dtype=torch.float32, device=dev)[None, :, None] + 0.5
    xs = torch.arange(width, dtype=torch.float32, device=dev)[None, None, :] + 0.5
    p = pos.reshape(-1, 2)
    dx, dy = xs - p[:, 0, None, None], ys - p[:, 1, None, None]  # [N, H, W]
    radius = physics.radius_px * _scale(height) * (1.0 + physics.pulse * energy.flatten())
    d = _sdf(shape.flatten(), dx, dy, radius)
    alpha = (0.5 - d).clamp(0.0, 1.0)[:, None]  # [N, 1, H, W] anti-aliased coverage
    inner = (-d - RIM_PX).clamp(0.0, 1.0)[:, None]
    rgb = SPRITE_RGB.to(dev)[colour.flatten()][:, :, None, None]  # [N, 3, 1, 1]
    sprite = rgb * (RIM_SCALE + (1.0 - RIM_SCALE) * inner)
    frames = bg * (1.0 - alpha) + sprite * alpha
    return frames.view(b, f, 3, height, width), alpha.view(b, f, height, width)


# --------------------------------------------------------------------------------------------
# one stateful world (demos, tests, classifier calibration)


class World:
    """One world, stepped a frame at a time on the CPU.

    ``step(keys, audio_energy)`` advances one frame and returns it as uint8 ``[H, W, 3]``
    (``advance`` then ``render``: a caller that looks at some frames only renders those);
    ``set_prompt`` changes what the prompt names from the next frame on, keeping the sprite's
    position and velocity. Unknown keys raise ``models.loops.inputs.InputError``.
    """

    def __init__(
        self,
        prompt: str,
        *,
        seed: int = 0,
        width: int = 96,
        height: int = 96,
        physics: Physics = PHYSICS,
    ) -> None:
        self.width, self.height, self.physics = width, height, physics
        self.spec: WorldSpec = parse_prompt(prompt)
        self._textures = terrain_textures(height, width)
        self.position = start_position(torch.tensor([seed]), height, width, physics)[0]
        self.velocity = torch.zeros(2)
        self.frames = 0

    def set_prompt(self, prompt: str) -> None:
        self.spec = parse_prompt(prompt)

    def step(self, keys: Sequence[str] = (), audio_energy: float = 0.0) -> torch.Tensor:
        self.advance(keys)
        return self.render(audio_energy)

    def advance(self, keys: Sequence[str] = ()) -> None:
        """Move the sprite one frame under ``keys`` (what ``step`` does before it renders)."""
        names = normalize_keys(keys)
        action = torch.tensor([[float(k in names) for k in ACTION_KEYS] + [0.0, 0.0]])
        direction, sprint = action_direction(action)
        _, pos, vel = simulate(
            self.position[None],
            self.velocity[None],
            direction[:, None],
            sprint[:, None],
            self.height,
            self.width,
            self.physics,
        )
        self.position, self.velocity = pos[0], vel[0]
        self.frames += 1

    def render(self, audio_energy: float = 0.0) -> torch.Tensor:
        """The frame at the sprite's current position, uint8 ``[H, W, 3]`` (audio only sizes
        the sprite: it moves nothing)."""
        s = self.spec
        frame = render_frames(
            self._textures,
            torch.tensor([[s.terrain]]),
            torch.tensor([[s.night]]),
            torch.tensor([[s.colour]]),
            torch.tensor([[s.shape]]),
            self.position[None, None],
            torch.tensor([[float(audio_energy)]]),
            self.physics,
        )[0, 0]  # [3, H, W]
        return (frame * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous()
