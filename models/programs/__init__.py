"""Programs (docs/architecture.md "The Program plane"): a card's loops composed into one task.

``graph`` (the typed graph and its parsing), ``validation`` (what a card can run), ``presets``
(the built-in programs) and ``comfyui`` (ComfyUI API-format workflows compiled to a program)
import no torch, so the request plane and the server read programs without loading a model;
``program_loop`` (torch) runs one on a loaded instance.
"""
