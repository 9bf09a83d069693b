"""The Program graph: typed nodes and edges, parsed from plain data, ordered before it runs.

A ``Program`` composes a card's loops into one task. Its nodes are

    loop      a model loop of the card (``chunk_rollout`` / ``diffusion_denoise``, or the one the
              card names for a capability): prompt in, latents out
    decode    a component: latents -> frames with a named decoder of the card (full | tiny)
    artifact  the job's file (MP4 for video, PNG for one frame): frames in
    stream    a live sink: frames published as they are made (a job's preview events)

and its edges carry one typed value between two ports::

    tensor    latents from a loop to a decoder, delivered piece by piece as the loop makes them
    artifact  frames to the artifact, whole, once their decoder finished
    stream    frames to a live sink, as each decode of them ran

Each port declares its value type (latents | frames) and the edge kinds it takes; ``validation``
checks a graph against them and against a card before anything is scheduled. This module is
plain data (no torch): the request plane and the server read and show programs without a model.
The wire form (``Program.to_dict`` / ``from_dict``)::

    {"name": "preview_and_final",
     "nodes": {"denoise": {"kind": "loop", "loop": "text_to_video"},
               "preview": {"kind": "decode", "decoder": "tiny"}, ...},
     "edges": [{"from": "denoise.latents", "to": "preview.latents", "kind": "tensor"}, ...]}
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from runtime.contract import DreamrtError

__all__ = [
    "INPUTS",
    "OUTPUTS",
    "PARAMS",
    "Edge",
    "EdgeKind",
    "Node",
    "NodeKind",
    "Port",
    "Program",
    "ProgramError",
    "ValueType",
]

_NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ProgramError(DreamrtError, ValueError):
    """A program that cannot run: ``problems`` lists every reason, each naming its node, edge
    or parameter (a 422 before any job exists)."""

    code = "invalid_program"
    status = 422

    def __init__(self, problems: list[str]) -> None:
        super().__init__(
            "invalid program: " + "; ".join(problems), field="program", problems=list(problems)
        )
        self.problems = list(problems)


class NodeKind(str, enum.Enum):
    LOOP = "loop"
    DECODE = "decode"
    ARTIFACT = "artifact"
    STREAM = "stream"


class EdgeKind(str, enum.Enum):
    TENSOR = "tensor"
    ARTIFACT = "artifact"
    STREAM = "stream"


class ValueType(str, enum.Enum):
    LATENTS = "latents"  # [1, C, f, h, w] in the DiT's latent space
    FRAMES = "frames"  # uint8 [n, H, W, 3] RGB


@dataclass(frozen=True, slots=True)
class Port:
    """One input or output of a node: the value it carries and the edges it takes."""

    name: str
    value: ValueType
    edges: frozenset[EdgeKind]


_LATENTS_IN = Port("latents", ValueType.LATENTS, frozenset({EdgeKind.TENSOR}))
INPUTS: Mapping[NodeKind, tuple[Port, ...]] = MappingProxyType(
    {
        NodeKind.LOOP: (),
        NodeKind.DECODE: (_LATENTS_IN,),
        NodeKind.ARTIFACT: (Port("frames", ValueType.FRAMES, frozenset({EdgeKind.ARTIFACT})),),
        NodeKind.STREAM: (Port("frames", ValueType.FRAMES, frozenset({EdgeKind.STREAM})),),
    }
)
OUTPUTS: Mapping[NodeKind, tuple[Port, ...]] = MappingProxyType(
    {
        NodeKind.LOOP: (_LATENTS_IN,),
        NodeKind.DECODE: (
            Port("frames", ValueType.FRAMES, frozenset({EdgeKind.ARTIFACT, EdgeKind.STREAM})),
        ),
        NodeKind.ARTIFACT: (),
        NodeKind.STREAM: (),
    }
)
# Every input port is required: a decoder without latents or a sink without frames cannot run.

# The parameters each node kind takes, with their JSON types (bool is not an int here).
PARAMS: Mapping[NodeKind, Mapping[str, tuple[type, ...]]] = MappingProxyType(
    {
        NodeKind.LOOP: MappingProxyType(
            {
                "loop": (str,),  # a capability ("text_to_video") or a loop id of the card
                "prompt": (str,),
                "negative_prompt": (str,),
                "num_frames": (int,),
                "width": (int,),
                "height": (int,),
                "seed": (int,),
                "steps": (int,),
                "guidance_scale": (int, float),
                "adapters": (list,),  # [[name, strength], ...]: registered LoRA adapters
                "session": (str,),  # continue this session from its next chunk boundary
                "chunks": (int,),  # ... for this many more chunks
            }
        ),
        NodeKind.DECODE: MappingProxyType({"decoder": (str,)}),
        NodeKind.ARTIFACT: MappingProxyType({"format": (str,)}),
        NodeKind.STREAM: MappingProxyType({"name": (str,)}),
    }
)


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    kind: NodeKind
    params: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    source_port: str
    target: str
    target_port: str
    kind: EdgeKind

    @property
    def key(self) -> str:
        """``"denoise.latents->final.latents"``: how program state names the edge."""
        return f"{self.source}.{self.source_port}->{self.target}.{self.target_port}"


@dataclass(frozen=True, slots=True)
class Program:
    """A typed graph (see the module docstring). Build with ``from_dict``; check with
    ``models.programs.validation.check`` before running it."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    name: str = "inline"

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"program {self.name!r} has no node {node_id!r}")

    def of_kind(self, kind: NodeKind) -> list[Node]:
        return [n for n in self.nodes if n.kind is kind]

    def into(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.target == node_id]

    def out_of(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.source == node_id]

    def order(self) -> list[str]:
        """Node ids in dependency order (ties: declaration order); ``ProgramError`` naming the
        nodes of a cycle."""
        ids = [n.node_id for n in self.nodes]
        waiting = {i: {e.source for e in self.into(i) if e.source in ids} for i in ids}
        order: list[str] = []
        while len(order) < len(ids):
            ready = [i for i in ids if i not in order and not waiting[i] - set(order)]
            if not ready:
                cycle = sorted(i for i in ids if i not in order)
                raise ProgramError([f"the edges between nodes {cycle} form a cycle"])
            order.append(ready[0])
        return order

    def depth(self) -> dict[str, int]:
        """Each node's distance from the graph's sources (a loop has 0)."""
        depth: dict[str, int] = {}
        for node_id in self.order():
            depth[node_id] = 1 + max((depth[e.source] for e in self.into(node_id)), default=-1)
        return depth

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "nodes": {n.node_id: {"kind": n.kind.value, **n.params} for n in self.nodes},
            "edges": [
                {
                    "from": f"{e.source}.{e.source_port}",
                    "to": f"{e.target}.{e.target_port}",
                    "kind": e.kind.value,
                }
                for e in self.edges
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Program:
        """Parses the wire form; ``ProgramError`` lists every malformed node and edge (an
        unknown kind or parameter, a parameter of the wrong type, an edge that is not
        ``node.port``)."""
        problems: list[str] = []
        if not isinstance(data, Mapping):
            raise ProgramError([f"a program is an object, got {type(data).__name__}"])
        unknown = sorted(set(data) - {"name", "nodes", "edges"})
        if unknown:
            problems.append(f"unknown program fields {unknown} (it has name, nodes, edges)")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, Mapping) or not raw_nodes:
            raise ProgramError([*problems, "'nodes' must be a non-empty object of node id -> node"])
        nodes = [n for i, spec in raw_nodes.items() if (n := _node(i, spec, problems))]
        edges = [e for spec in data.get("edges") or [] if (e := _edge(spec, problems))]
        if problems:
            raise ProgramError(problems)
        name = data.get("name") or "inline"
        return cls(tuple(nodes), tuple(edges), str(name))


def _node(node_id: Any, spec: Any, problems: list[str]) -> Node | None:
    if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
        problems.append(f"node id {node_id!r} must be 1-64 letters, digits, '_' or '-'")
        return None
    if not isinstance(spec, Mapping):
        problems.append(f"node {node_id!r} must be an object with a 'kind'")
        return None
    try:
        kind = NodeKind(spec.get("kind"))
    except ValueError:
        kinds = [k.value for k in NodeKind]
        problems.append(f"node {node_id!r}: kind {spec.get('kind')!r} is not one of {kinds}")
        return None
    params = {k: v for k, v in spec.items() if k != "kind"}
    allowed = PARAMS[kind]
    for name, value in params.items():
        types = allowed.get(name)
        if types is None:
            problems.append(
                f"node {node_id!r} ({kind.value}): unknown parameter {name!r} "
                f"(it takes {sorted(allowed)})"
            )
        elif value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            names = "/".join(t.__name__ for t in types)
            problems.append(f"node {node_id!r}: parameter {name!r} must be {names}, got {value!r}")
    return Node(node_id, kind, MappingProxyType(params))


def _edge(spec: Any, problems: list[str]) -> Edge | None:
    if not isinstance(spec, Mapping):
        problems.append(f"an edge must be an object with 'from', 'to' and 'kind', got {spec!r}")
        return None
    ends = []
    for end in ("from", "to"):
        value = spec.get(end)
        if not isinstance(value, str) or value.count(".") != 1:
            problems.append(f"edge {dict(spec)}: {end!r} must be 'node.port'")
            return None
        ends.append(value.split("."))
    try:
        kind = EdgeKind(spec.get("kind", "tensor"))
    except ValueError:
        kinds = [k.value for k in EdgeKind]
        problems.append(f"edge {dict(spec)}: kind {spec.get('kind')!r} is not one of {kinds}")
        return None
    (source, source_port), (target, target_port) = ends
    return Edge(source, source_port, target, target_port, kind)
