"""The tiny world's closed vocabulary: what a prompt can name, and how prompt text maps onto it.

A prompt names up to three things, in any order and wording::

    "a purple triangle on snow at night"  ->  WorldSpec(terrain=snow, night=True,
                                                         colour=purple, shape=triangle)

- a **terrain** (grass, sand, water, snow, stone) and optionally **night** (darkens it);
  the *background class* a viewer sees is ``night`` when night is named, else the terrain;
- a sprite **colour** (red, green, blue, yellow, white, purple);
- a sprite **shape** (ball, square, triangle).

Synonyms map onto the same word (``circle`` -> ball, ``ocean`` -> water, ``violet`` -> purple);
every other word is ignored. What a prompt leaves out takes a fixed default (grass, red, ball),
so the world a prompt describes is a pure function of the prompt.

Token ids (``word_ids``) are what the learned text encoder embeds: 0 is padding, then the
canonical words in the order of ``WORDS``. Synonyms share the id of their canonical word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "BACKGROUNDS",
    "COLOURS",
    "SHAPES",
    "TERRAINS",
    "WORDS",
    "WorldSpec",
    "parse_prompt",
    "prompt_text",
    "word_ids",
]

TERRAINS: tuple[str, ...] = ("grass", "sand", "water", "snow", "stone")
BACKGROUNDS: tuple[str, ...] = (*TERRAINS, "night")  # the classes a viewer can tell apart
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "white", "purple")
SHAPES: tuple[str, ...] = ("ball", "square", "triangle")
WORDS: tuple[str, ...] = (*TERRAINS, "night", *COLOURS, *SHAPES)

_SYNONYMS: dict[str, str] = {
    "grassy": "grass",
    "meadow": "grass",
    "field": "grass",
    "lawn": "grass",
    "forest": "grass",
    "sandy": "sand",
    "desert": "sand",
    "beach": "sand",
    "dune": "sand",
    "dunes": "sand",
    "sea": "water",
    "ocean": "water",
    "lake": "water",
    "river": "water",
    "pond": "water",
    "snowy": "snow",
    "ice": "snow",
    "icy": "snow",
    "glacier": "snow",
    "winter": "snow",
    "rock": "stone",
    "rocky": "stone",
    "rocks": "stone",
    "stones": "stone",
    "cave": "stone",
    "pavement": "stone",
    "cobblestone": "stone",
    "dark": "night",
    "nighttime": "night",
    "midnight": "night",
    "moonlit": "night",
    "crimson": "red",
    "scarlet": "red",
    "lime": "green",
    "emerald": "green",
    "navy": "blue",
    "azure": "blue",
    "cyan": "blue",
    "gold": "yellow",
    "golden": "yellow",
    "ivory": "white",
    "snowwhite": "white",
    "violet": "purple",
    "magenta": "purple",
    "lilac": "purple",
    "balls": "ball",
    "circle": "ball",
    "disc": "ball",
    "disk": "ball",
    "orb": "ball",
    "sphere": "ball",
    "dot": "ball",
    "squares": "square",
    "box": "square",
    "cube": "square",
    "block": "square",
    "triangles": "triangle",
    "pyramid": "triangle",
    "wedge": "triangle",
}
_WORD_ID = {word: i + 1 for i, word in enumerate(WORDS)}
_TOKEN = re.compile(r"[a-z]+")

DEFAULT_TERRAIN, DEFAULT_COLOUR, DEFAULT_SHAPE = "grass", "red", "ball"


@dataclass(frozen=True, slots=True)
class WorldSpec:
    """What a prompt asks for (indices into ``TERRAINS``/``COLOURS``/``SHAPES``)."""

    terrain: int
    night: bool
    colour: int
    shape: int

    @property
    def background(self) -> int:
        """Index into ``BACKGROUNDS``: night wins over the terrain."""
        return BACKGROUNDS.index("night") if self.night else self.terrain

    def describe(self) -> str:
        night = " at night" if self.night else ""
        return f"{COLOURS[self.colour]} {SHAPES[self.shape]} on {TERRAINS[self.terrain]}{night}"


def _canonical_words(text: str) -> list[str]:
    words = []
    for token in _TOKEN.findall(text.lower()):
        word = _SYNONYMS.get(token, token)
        if word in _WORD_ID:
            words.append(word)
    return words


def parse_prompt(text: str) -> WorldSpec:
    """The world a prompt describes (the last word of each category wins; defaults fill in)."""
    terrain, colour, shape, night = DEFAULT_TERRAIN, DEFAULT_COLOUR, DEFAULT_SHAPE, False
    for word in _canonical_words(text):
        if word in TERRAINS:
            terrain = word
        elif word in COLOURS:
            colour = word
        elif word in SHAPES:
            shape = word
        elif word == "night":
            night = True
    return WorldSpec(TERRAINS.index(terrain), night, COLOURS.index(colour), SHAPES.index(shape))


def word_ids(text: str, length: int) -> list[int]:
    """Ids of the vocabulary words in ``text`` (in order, first ``length``), padded with 0."""
    ids = [_WORD_ID[w] for w in _canonical_words(text)][:length]
    return ids + [0] * (length - len(ids))


_TEMPLATES = (
    "a {colour} {shape} on {terrain}{night}",
    "{colour} {shape}, {terrain}{night}",
    "a {shape} that is {colour} on the {terrain}{night}",
    "the {terrain}{night} with a {colour} {shape}",
)


def prompt_text(spec: WorldSpec, template: int = 0) -> str:
    """A natural prompt for ``spec`` (one of a few fixed templates)."""
    return _TEMPLATES[template % len(_TEMPLATES)].format(
        colour=COLOURS[spec.colour],
        shape=SHAPES[spec.shape],
        terrain=TERRAINS[spec.terrain],
        night=" at night" if spec.night else "",
    )
