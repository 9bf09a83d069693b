"""What a program must satisfy before anything of it is scheduled, alone and against a card.

``problems(program, card)`` lists every reason it cannot run, each naming the node, edge or
parameter at fault; ``check`` raises them as one ``ProgramError``. Structure: edges join ports
that exist, carry the value both ends declare, and are of a kind both ends take; every input is
fed by exactly one edge; the graph has no cycle, at least one loop and exactly one artifact (a
job keeps one file). Against the card: each loop node names a loop the card serves for a task
(a capability it declares, or one of its denoising loops), each decode node a decoder the
card has, each artifact a format of its loop's task; a node continuing a session runs the
card's ``chunk_rollout``.
"""

from __future__ import annotations

from models.card import CAPABILITIES, DENOISING_LOOPS, LoopKind, ModelCard
from models.programs.graph import INPUTS, OUTPUTS, Node, NodeKind, Program, ProgramError

__all__ = ["artifact_task", "check", "loop_spec_id", "problems", "task_of"]

_TASK_CAPABILITY = {"t2v": "text_to_video", "t2i": "text_to_image"}
_ARTIFACT_FORMATS = {"t2v": "mp4", "t2i": "png"}


def check(program: Program, card: ModelCard) -> None:
    """``ProgramError`` listing every problem (see the module docstring); None if it can run."""
    found = problems(program, card)
    if found:
        raise ProgramError(found)


def problems(program: Program, card: ModelCard) -> list[str]:
    found = _structure(program)
    for node in program.nodes:
        if node.kind is NodeKind.LOOP:
            found += _loop_problems(node, card)
        elif node.kind is NodeKind.DECODE:
            decoder = node.get("decoder")
            if decoder not in card.decoders:
                found.append(
                    f"node {node.node_id!r}: decoder {decoder!r} is not served by model "
                    f"{card.model_id!r} (its decoders: {list(card.decoders)})"
                )
        elif node.kind is NodeKind.ARTIFACT:
            found += _artifact_problems(program, node.node_id)
    return found


def task_of(program: Program, loop_node: str) -> str:
    """``"t2v"`` or ``"t2i"``: the task a loop node runs (its ``loop``'s capability)."""
    node = program.node(loop_node)
    if node.get("loop") == "text_to_image" or node.get("num_frames") == 1:
        return "t2i"
    return "t2v"


def artifact_task(program: Program) -> str:
    """The task whose output the program's artifact holds (``"t2v"``: an MP4, ``"t2i"``: a
    PNG): that of the loop upstream of it. Needs a valid program."""
    artifact = program.of_kind(NodeKind.ARTIFACT)[0]
    return task_of(program, _upstream_loops(program, artifact.node_id)[0])


def loop_spec_id(card: ModelCard, loop: str | None, task: str) -> str | None:
    """The card's loop id a loop node runs: ``loop`` names a capability (the card's loop for
    it) or one of its denoising loops; None (not given): the task's."""
    name = loop or _TASK_CAPABILITY[task]
    if name in CAPABILITIES:
        spec = card.loop_for(name)
        return spec.loop_id if spec is not None else None
    spec = card.loops.get(name)
    if spec is None or spec.kind not in DENOISING_LOOPS:
        return None
    return spec.loop_id


def _structure(program: Program) -> list[str]:
    found: list[str] = []
    ids = [n.node_id for n in program.nodes]
    kinds = {n.node_id: n.kind for n in program.nodes}
    fed: dict[tuple[str, str], int] = {}
    for edge in program.edges:
        name = f"edge {edge.key}"
        fed[(edge.target, edge.target_port)] = fed.get((edge.target, edge.target_port), 0) + 1
        ports = []
        for node_id, port_name, table, side in (
            (edge.source, edge.source_port, OUTPUTS, "output"),
            (edge.target, edge.target_port, INPUTS, "input"),
        ):
            if node_id not in kinds:
                found.append(f"{name}: no node {node_id!r} (nodes: {ids})")
                break
            port = next((p for p in table[kinds[node_id]] if p.name == port_name), None)
            if port is None:
                names = [p.name for p in table[kinds[node_id]]]
                found.append(
                    f"{name}: {kinds[node_id].value} node {node_id!r} has no {side} "
                    f"{port_name!r} (its {side}s: {names})"
                )
                break
            ports.append(port)
        if len(ports) < 2:
            continue
        out, into = ports
        if out.value is not into.value:
            found.append(
                f"{name}: {edge.source_port!r} carries {out.value.value}, "
                f"{edge.target_port!r} takes {into.value.value}"
            )
        for port, node_id in ((out, edge.source), (into, edge.target)):
            if edge.kind not in port.edges:
                takes = sorted(k.value for k in port.edges)
                found.append(
                    f"{name}: a {edge.kind.value} edge cannot join {node_id}.{port.name} "
                    f"(it takes {takes} edges)"
                )
    for node in program.nodes:
        for port in INPUTS[node.kind]:
            count = fed.get((node.node_id, port.name), 0)
            if count == 0:
                found.append(f"node {node.node_id!r}: required input {port.name!r} is unconnected")
            elif count > 1:
                found.append(f"node {node.node_id!r}: input {port.name!r} is fed by {count} edges")
    if not program.of_kind(NodeKind.LOOP):
        found.append("a program needs at least one loop node")
    artifacts = [n.node_id for n in program.of_kind(NodeKind.ARTIFACT)]
    if len(artifacts) != 1:
        found.append(f"a program makes exactly one artifact; it has {len(artifacts)} {artifacts}")
    try:
        program.order()
    except ProgramError as exc:
        found += exc.problems
    return found


def _loop_problems(node: Node, card: ModelCard) -> list[str]:
    found: list[str] = []
    name = node.get("loop")
    task = "t2i" if name == "text_to_image" or node.get("num_frames") == 1 else "t2v"
    capability = _TASK_CAPABILITY[task]
    if capability not in card.capabilities:
        found.append(
            f"node {node.node_id!r}: model {card.model_id!r} cannot run {capability!r} "
            f"(it has {sorted(card.capabilities)})"
        )
        return found
    loop_id = loop_spec_id(card, name, task)
    if loop_id is None:
        serving = sorted(i for i, s in card.loops.items() if s.kind in DENOISING_LOOPS)
        found.append(
            f"node {node.node_id!r}: loop {name!r} is not served by model {card.model_id!r} "
            f"(its loops: {serving}, or a capability of {sorted(card.capabilities)})"
        )
        return found
    if node.get("session") is not None:
        if card.loops[loop_id].kind is not LoopKind.CHUNK_ROLLOUT:
            found.append(
                f"node {node.node_id!r}: continuing session {node.get('session')!r} needs "
                f"chunk_rollout; model {card.model_id!r} runs {loop_id!r}"
            )
        chunks = node.get("chunks")
        if not isinstance(chunks, int) or chunks < 1:
            found.append(f"node {node.node_id!r}: 'chunks' must be >= 1 to continue a session")
    for field in ("num_frames", "width", "height", "steps"):
        value = node.get(field)
        if value is not None and value < 1:
            found.append(f"node {node.node_id!r}: {field}={value} must be >= 1")
    return found


def _artifact_problems(program: Program, node_id: str) -> list[str]:
    node = program.node(node_id)
    loops = _upstream_loops(program, node_id)
    if not loops:
        return []  # the structure check names the missing input
    task = task_of(program, loops[0])
    expected = _ARTIFACT_FORMATS[task]
    fmt = node.get("format", expected)
    if fmt != expected:
        return [
            f"node {node_id!r}: format {fmt!r} cannot hold the {task} output of loop "
            f"{loops[0]!r} (it makes {expected!r})"
        ]
    return []


def _upstream_loops(program: Program, node_id: str) -> list[str]:
    seen: list[str] = []
    stack = [e.source for e in program.into(node_id)]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.append(current)
        stack += [e.source for e in program.into(current)]
    kinds = {n.node_id: n.kind for n in program.nodes}
    return [i for i in seen if kinds.get(i) is NodeKind.LOOP]
