"""tiny-world: the embedded default model, with the recipe that trained it.

A procedural world (``world``, ``vocab``) renders a sprite on a terrain that keys steer and
audio pulses; the card (``card``) serves a small Wan-architecture chunk-causal DiT over pixel
latents (``codec``, ``prediction``, ``text``, ``components``) through the shared
``chunk_rollout`` loop; the recipe (``training/``: ``data``, ``pairs``, ``teacher_forcing``,
``probe``, ``recipe``) trains it on clips of that world; ``evaluation/`` (``evaluate``, with
``classify`` and ``stream``) scores it through the real loop; ``cli``
adds ``dreamrt train|eval tiny-world``. The shipped weights live in ``weights/``.
"""
