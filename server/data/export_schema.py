"""The columns of ``dreamrt export``'s Parquet tables, their rows, and the dataset README.

Each column is declared once, as (name, Arrow type, meaning): the Arrow schema, the README's
schema tables and the row builders all come from these lists, so they cannot drift apart.
References: a chunk is ``<session>@<chunk>`` (chunk numbers never repeat within a session), a
fork candidate's whole stream is its session id (its rows in ``records``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa

__all__ = ["PREFERENCE_COLUMNS", "PREFERENCE_SCHEMA", "RECORD_COLUMNS", "RECORD_SCHEMA"]

_TS = pa.timestamp("us", tz="UTC")
_STR, _I32, _I64, _F64 = pa.string(), pa.int32(), pa.int64(), pa.float64()

RECORD_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("chunk_ref", _STR, "`<session>@<chunk>`: how preferences name this chunk"),
    ("session_id", _STR, "the session that showed the chunk"),
    ("segment", _I32, "Dreamverse segment (a prompt cut starts the next)"),
    ("chunk", _I32, "chunk index within the session (never repeats)"),
    ("created_at", _TS, "when the record was written"),
    ("model_id", _STR, "model card id"),
    ("recipe_id", _STR, "the card's recipe (how its weights were made)"),
    ("weights_version", _STR, "content hash of the loaded weights (`b2:` + 16 hex)"),
    ("weights_label", _STR, "the card's name for its weights version"),
    ("loop_id", _STR, "the loop that generated it (`chunk_rollout`)"),
    (
        "loop_ref",
        _STR,
        "the engine loop (its snapshots, its input log); a chosen candidate's goes on",
    ),
    ("sampler", _STR, "the card's sampler description"),
    ("steps", _I32, "denoising steps per chunk"),
    ("timesteps", pa.list_(_F64), "model timesteps of the steps"),
    ("sigmas", pa.list_(_F64), "noise levels, one per step plus the final 0"),
    ("precision", _STR, "serving precision (fp32, bf16, ...)"),
    ("seed", _I64, "the stream's seed (a fork candidate's own)"),
    ("rng", _STR, "how the noise seeds derive from the seed"),
    ("noise_seeds", pa.list_(_I64), "seed of the initial noise, then of each step's noise"),
    ("prompt", _STR, "prompt in force"),
    ("prompt_seq", _I32, "input sequence number of that prompt (0: the initial one)"),
    ("prompt_digest", _STR, "digest of the prompt's text-encoder embedding"),
    ("action_seq", _I32, "sequence number of the action latched for the chunk (null: none)"),
    ("action_keys", pa.list_(_STR), "held keys of that action"),
    ("action_mouse", pa.list_(_F64), "mouse [dx, dy] of that action"),
    ("action_digest", _STR, "digest of the action vector the model saw ('' none)"),
    ("audio_seqs", pa.list_(_I32), "sequence numbers of the audio clips the chunk reflects"),
    ("audio_digest", _STR, "digest of the audio features the model saw ('' none)"),
    ("kv_sink_frames", _I32, "chunk-KV sink frames"),
    ("kv_window_frames", _I32, "chunk-KV ring frames"),
    ("kv_frames_cached", _I32, "latent frames written to the chunk-KV before this chunk"),
    ("latent_frame_start", _I32, "latent position (RoPE) of the chunk's first frame"),
    (
        "restart_policy",
        _STR,
        "when a changing input restarted the chunk in flight (`dreamrt serve --steering`)",
    ),
    ("attention", _STR, "self-attention backend that served it (`sdpa`, `fp8-triton`, ...)"),
    ("decoder", _STR, "how its latents became frames: `full` (the VAE) or `tiny` (TAEHV)"),
    (
        "step_batch",
        _I32,
        "largest batch its denoising steps ran in (> 1: equal to a solo run within the "
        "batched tolerance, not bit for bit)",
    ),
    ("group_id", _STR, "the rollout group (`POST /v1/rollouts`) of a sample; null: a session"),
    ("adapters", pa.list_(_STR), "LoRA adapters it ran with: `name@version:strength`"),
    ("fps", _I32, "frames per second"),
    ("width", _I32, "frame width"),
    ("height", _I32, "frame height"),
    ("pts_start", _I64, "PTS (90 kHz) of the first frame"),
    ("pts_end", _I64, "PTS of the last frame"),
    ("num_frames", _I32, "frames in the chunk"),
    ("digest", _STR, "sha256 (16 hex) of the chunk's uint8 frames: equal means bit-identical"),
    ("replay_key", _STR, "`<loop>@<step>`: the snapshot `dreamrt replay` starts from"),
    ("media", _STR, "the chunk's MP4 (or latents) under this directory; null if not kept"),
)

PREFERENCE_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("source", _STR, "`rating` or `fork-choice`"),
    ("context_ref", _STR, "the chunk the preference is about (rating) or forked after"),
    ("chosen_ref", _STR, "preferred: the rated chunk (rating 1) or the chosen candidate"),
    ("rejected_ref", _STR, "dispreferred: the rated chunk (rating -1) or a rejected candidate"),
    ("rating", pa.int8(), "-1, 0 or 1 (ratings; null for fork choices)"),
    ("note", _STR, "the rater's note, if any"),
    ("created_at", _TS, "when it was committed"),
    ("session_id", _STR, "the session rated or forked"),
    ("model_id", _STR, "model card id"),
    ("weights_version", _STR, "content hash of the weights that made the context chunk"),
)

RECORD_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in RECORD_COLUMNS])
PREFERENCE_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in PREFERENCE_COLUMNS])


def _ts(seconds: float | None) -> dt.datetime | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC)


def _json(value: Any, default: Any) -> Any:
    return default if value is None else json.loads(value) if isinstance(value, str) else value


def record_row(row: dict[str, Any], media: str | None) -> dict[str, object]:
    """A ``records`` table row (SQLite) as a ``RECORD_SCHEMA`` row."""
    actions = _json(row.get("actions"), {})
    action = actions.get("action") or {}
    kv = _json(row.get("kv_window"), {})
    return {
        "chunk_ref": f"{row['session_id']}@{row['chunk']}",
        **{k: row.get(k) for k in ("session_id", "segment", "chunk", "model_id", "recipe_id")},
        **{k: row.get(k) for k in ("weights_version", "weights_label", "loop_id", "loop_ref")},
        **{k: row.get(k) for k in ("sampler", "steps", "precision", "seed", "rng", "prompt")},
        "created_at": _ts(row.get("created_at")),
        "timesteps": [float(t) for t in _json(row.get("timesteps"), [])],
        "sigmas": _json(row.get("sigmas"), []),
        "noise_seeds": _json(row.get("noise_seeds"), []),
        "prompt_seq": row.get("prompt_seq"),
        "prompt_digest": row.get("prompt_digest"),
        "action_seq": action.get("seq"),
        "action_keys": action.get("keys", []),
        "action_mouse": [float(m) for m in action.get("mouse", [])],
        "action_digest": row.get("action_digest"),
        "audio_seqs": actions.get("audio_seqs", []),
        "audio_digest": row.get("audio_digest"),
        "kv_sink_frames": kv.get("sink_frames"),
        "kv_window_frames": kv.get("window_frames"),
        "kv_frames_cached": kv.get("frames_cached"),
        **{k: row.get(k) for k in ("latent_frame_start", "restart_policy", "attention")},
        **{k: row.get(k) for k in ("decoder", "step_batch")},
        "group_id": row.get("group_id"),
        "adapters": _json(row.get("adapters"), []),
        **{k: row.get(k) for k in ("fps", "width", "height")},
        **{k: row.get(k) for k in ("pts_start", "pts_end", "num_frames", "digest", "replay_key")},
        "media": media,
    }


def preference_rows(
    feedback: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    sessions: dict[str, dict[str, Any]],
    chunks: dict[tuple[str, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Ratings (``feedback``) and fork choices (``preferences``) as ``PREFERENCE_SCHEMA`` rows,
    in commit order."""
    rows = []
    for fb in feedback:
        ref = f"{fb['session_id']}@{fb['chunk']}"
        made = chunks.get((fb["session_id"], fb["chunk"]), {})
        rating = int(fb["rating"])
        rows.append(
            {
                "source": "rating",
                "context_ref": ref,
                "chosen_ref": ref if rating > 0 else None,
                "rejected_ref": ref if rating < 0 else None,
                "rating": rating,
                "note": fb.get("note"),
                "created_at": _ts(fb["created_at"]),
                "session_id": fb["session_id"],
                "model_id": made.get("model_id")
                or sessions.get(fb["session_id"], {}).get("model_id"),
                "weights_version": made.get("weights_version"),
            }
        )
    for pair in pairs:
        rows.append(
            {
                "source": pair["source"],
                "context_ref": pair["context_ref"],
                "chosen_ref": pair["chosen_ref"],
                "rejected_ref": pair["rejected_ref"],
                "rating": None,
                "note": None,
                "created_at": _ts(pair["created_at"]),
                "session_id": pair.get("session_id"),
                "model_id": pair.get("model_id"),
                "weights_version": pair.get("weights_version"),
            }
        )
    return sorted(rows, key=lambda r: r["created_at"])


def _table(columns: tuple[tuple[str, pa.DataType, str], ...]) -> str:
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | `{kind}` | {meaning} |" for name, kind, meaning in columns]
    return "\n".join(lines)


def readme(manifest: dict[str, Any], *, latents: bool) -> str:
    """The dataset card: front matter for ``datasets``, how to load it, the schema, the parts."""
    parts = "\n".join(
        f"| `{p['part']}` | {p['since'] or '(start)'} | {p['until']} | {p['records']} | "
        f"{p['preferences']} |"
        for p in manifest["parts"]
    )
    media = (
        "`latents/<session>/<segment>_<chunk>.safetensors`: each chunk's final latents "
        "(tensor `latents`, [1, C, f, h, w]), regenerated by replay"
        if latents
        else "`media/<session>/<segment>_<chunk>.mp4`: each chunk's frames as generated (H.264)"
    )
    return f"""---
configs:
- config_name: records
  data_files: records/*.parquet
- config_name: preferences
  data_files: preferences/*.parquet
---
# dreamrt behaviour and preference dataset

Exported by `dreamrt export`. Every generated chunk of every session is a row of `records`;
every rating and every fork choice is a row of `preferences`. {media}.

```python
import pandas as pd, datasets
records = pd.read_parquet("records")
prefs = pd.read_parquet("preferences")
ds = datasets.load_dataset("parquet", data_dir="records")
ds = datasets.load_dataset(".", "records")  # the configs above
```

A chunk is named `<session>@<chunk>` (`records.chunk_ref`); a fork candidate's whole stream
is its session id. `dreamrt replay --data-dir DIR --session S --chunk K` regenerates a chunk
from its `replay_key` on the server's data directory and checks its `digest`.

## records

{_table(RECORD_COLUMNS)}

## preferences

{_table(PREFERENCE_COLUMNS)}

## parts

Each `dreamrt export --since T` appends one part per table; none is ever rewritten.

| part | since | until | records | preferences |
| --- | --- | --- | --- | --- |
{parts}
"""
