"""docs/architecture.md §1: sessions/ imports runtime/ and the model registry's card types,
never server/, clients/ or model code (no torch); server/ is reached only from the composition
root. import-linter holds the layers and keeps clients/ to the wire format ([tool.importlinter]);
this probe names the exact model modules a sessions import loads."""

import subprocess
import sys

PROBE = """
import sys
import sessions.host, sessions.job_host, sessions.served_models, sessions.session, sessions.job
import sessions.input_ledger, sessions.chunk_stream
import sessions.loop_watch, sessions.persistence, sessions.store, sessions.events, sessions.audio
import sessions.artifacts, sessions.media_queue, sessions.prompt_memory, sessions.states
import sessions.latency, sessions.forks, sessions.recording
import sessions.records, sessions.snapshot_keeper, sessions.input_log
import sessions.model_hold, sessions.weight_sync, sessions.model_sleep, sessions.rollout_groups
import sessions.trainer_controls, sessions.workflows, sessions.moments
top = ('server', 'clients', 'models', 'torch')
loaded = sorted(m for m in sys.modules if m.split('.')[0] in top)
print(','.join(loaded))
"""


def test_sessions_import_no_server_client_or_model_code() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.strip()
    # models/card/ re-exports its parts, each a module of its own (models/card/*.py).
    card_parts = [
        "models.card.checks",
        "models.card.errors",
        "models.card.manifest",
        "models.card.model",
        "models.card.parallel",
        "models.card.profile",
        "models.card.recipe",
        "models.card.specs",
        "models.card.ui",
        "models.card.vocabulary",
    ]
    assert out.split(",") == [
        "models",
        "models.card",
        *card_parts,
        "models.loops",
        "models.loops.requests",
        # programs as data: the graph, its checks, the presets and the ComfyUI compiler (their
        # runner is model code)
        "models.programs",
        "models.programs.comfyui",
        "models.programs.comfyui_nodes",
        "models.programs.graph",
        "models.programs.presets",
        "models.programs.validation",
    ]
