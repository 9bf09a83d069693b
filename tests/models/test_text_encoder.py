"""models/wan/text_encoder.py: UMT5 wrapper vs transformers, tokenizers, content-hash cache."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from models.wan.card import CARDS
from models.wan.text_encoder import (
    UMT5_PRESETS,
    ByteFallbackTokenizer,
    CachedTextEncoder,
    TextEmbeddingCache,
    TextEncoderError,
    UMT5TextEncoder,
    clean_prompt,
)
from runtime.contract import CacheKey

WORDS = ["a", "red", "fox", "in", "the", "snow", "blue", "whale", "at", "dawn", "city", "night"]
TEXT_LEN = 12


def write_checkpoint(root: Path, *, d_model: int = 24, seed: int = 0) -> tuple[Path, Path]:
    """A diffusers-layout text_encoder/ (random UMT5) and tokenizer/ (word-level, EOS-appending)."""
    config = UMT5Config(
        vocab_size=64,
        d_model=d_model,
        d_kv=6,
        d_ff=40,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    UMT5EncoderModel(config).save_pretrained(root / "text_encoder")
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(root / "tokenizer")
    return root / "text_encoder", root / "tokenizer"


def reference_embeddings(
    encoder_dir: Path, tokenizer_dir: Path, prompts: list[str], text_len: int
) -> torch.Tensor:
    """What diffusers' WanPipeline._get_t5_prompt_embeds computes, step by step."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    model = UMT5EncoderModel.from_pretrained(str(encoder_dir), dtype=torch.float32).eval()
    inputs = tokenizer(
        prompts,
        padding="max_length",
        max_length=text_len,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    seq_lens = inputs.attention_mask.gt(0).sum(dim=1).long()
    with torch.no_grad():
        hidden = model(inputs.input_ids, inputs.attention_mask).last_hidden_state
    rows = [u[:v] for u, v in zip(hidden, seq_lens, strict=True)]
    return torch.stack([torch.cat([u, u.new_zeros(text_len - u.size(0), u.size(1))]) for u in rows])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_checkpoint(tmp_path_factory.mktemp("wan_text"))


@pytest.fixture(scope="module")
def tiny() -> UMT5TextEncoder:
    return UMT5TextEncoder.from_preset("umt5-tiny", seed=0)


class SpyEncoder:
    """Forwards to a real encoder and records every batch it was asked to encode."""

    def __init__(self, inner: UMT5TextEncoder) -> None:
        self.inner = inner
        self.batches: list[list[str]] = []
        self.precision = inner.precision
        self.shape_sig = inner.shape_sig

    def encode(self, texts: list[str]) -> torch.Tensor:
        self.batches.append(list(texts))
        return self.inner.encode(texts)


def make_cached(encoder, store=None, **overrides) -> CachedTextEncoder:
    kwargs = {"model_id": "wan-tiny-random", "weights_version": "random-seed-0", **overrides}
    return CachedTextEncoder(
        encoder, store if store is not None else TextEmbeddingCache(), **kwargs
    )


# --------------------------------------------------------------------------------------------
# parity with transformers


def test_pretrained_matches_transformers_pipeline_exactly(checkpoint):
    encoder_dir, tokenizer_dir = checkpoint
    prompts = ["a red fox in the snow", "blue whale", "a city at night " * 4, ""]
    ours = UMT5TextEncoder.from_pretrained(
        encoder_dir, tokenizer_dir, text_len=TEXT_LEN, dtype=torch.float32
    ).encode(prompts)
    ref = reference_embeddings(encoder_dir, tokenizer_dir, prompts, TEXT_LEN)
    assert ours.shape == (4, TEXT_LEN, 24)
    assert torch.equal(ours, ref)
    # real rows are non-zero, padding rows exactly zero: 6 words + EOS, 2 + EOS, all, EOS only
    real = ours.abs().sum(-1).gt(0).sum(-1).tolist()
    assert real == [7, 3, TEXT_LEN, 1]


def test_random_preset_matches_direct_umt5_call(tiny):
    prompts = ["a red fox", "x" * 40]
    ids, mask = tiny.tokenize(prompts)
    with torch.no_grad():
        direct = tiny.model(input_ids=ids, attention_mask=mask).last_hidden_state
    ours = tiny.encode(prompts)
    assert ours.shape == (2, 16, 32)
    valid = mask.bool()
    assert torch.equal(ours[valid], direct[valid])
    assert torch.equal(ours[~valid], torch.zeros_like(ours[~valid]))
    assert mask.sum(-1).tolist() == [10, 16]  # 9 bytes + EOS; 40 bytes fold into 15 + EOS


def test_bf16_encoder_reports_its_precision(checkpoint):
    encoder_dir, tokenizer_dir = checkpoint
    enc = UMT5TextEncoder.from_pretrained(encoder_dir, tokenizer_dir, text_len=TEXT_LEN)
    out = enc.encode(["a red fox"])
    assert (enc.precision, out.dtype) == ("bf16", torch.bfloat16)
    ref = reference_embeddings(encoder_dir, tokenizer_dir, ["a red fox"], TEXT_LEN)
    assert torch.allclose(out.float(), ref, atol=0.1, rtol=0.05)
    assert torch.equal(out[0, 4:], torch.zeros_like(out[0, 4:]))


def test_preset_weights_are_seeded_and_leave_global_rng_alone():
    before = torch.random.get_rng_state()
    a = UMT5TextEncoder.from_preset("umt5-tiny", seed=3).encode(["fox"])
    b = UMT5TextEncoder.from_preset("umt5-tiny", seed=3).encode(["fox"])
    c = UMT5TextEncoder.from_preset("umt5-tiny", seed=4).encode(["fox"])
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert UMT5TextEncoder.from_preset("umt5-tiny").model.training is False


# --------------------------------------------------------------------------------------------
# loading errors


def test_missing_tokenizer_files_is_a_clear_error(checkpoint, tmp_path):
    encoder_dir, _ = checkpoint
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(TextEncoderError, match="no tokenizer files.*nothing is downloaded"):
        UMT5TextEncoder.from_pretrained(encoder_dir, tmp_path / "tokenizer")


def test_missing_config_and_wrong_width_are_clear_errors(checkpoint, tmp_path):
    encoder_dir, tokenizer_dir = checkpoint
    with pytest.raises(TextEncoderError, match="has no config.json"):
        UMT5TextEncoder.from_pretrained(tmp_path, tokenizer_dir)
    with pytest.raises(TextEncoderError, match="d_model=24, preset 'umt5-tiny' expects 32"):
        UMT5TextEncoder.from_pretrained(encoder_dir, tokenizer_dir, preset="umt5-tiny")
    with pytest.raises(TextEncoderError, match=r"unknown UMT5 preset 'umt5-base'.*umt5-tiny"):
        UMT5TextEncoder.from_preset("umt5-base")


# --------------------------------------------------------------------------------------------
# tokenizers and presets


def test_byte_fallback_ids_mask_and_folding():
    tok = ByteFallbackTokenizer(vocab_size=384)
    ids, mask = tok(["ab", ""], 6)
    assert ids.tolist() == [[3 + 97, 3 + 98, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    long_a, _ = tok(["a forest at dawn, cinematic"], 6)
    long_b, _ = tok(["a forest at dawn, watercolor"], 6)
    assert long_a[0, -1] == 1 and long_b[0, -1] == 1  # EOS kept at the end
    assert not torch.equal(long_a, long_b)  # same 5-byte prefix, different prompts
    assert int(long_a.max()) < 384 and int(long_a[0, :5].min()) >= 3
    with pytest.raises(TextEncoderError, match="vocab_size > 4"):
        ByteFallbackTokenizer(vocab_size=4)


def test_clean_prompt_matches_wan_whitespace_cleaning():
    assert clean_prompt("  a\n red\t\tfox &amp;amp; snow ") == "a red fox & snow"


def test_presets_match_umt5_xxl_and_the_wan_cards():
    xxl = UMT5Config(**UMT5_PRESETS["umt5-xxl"].config)
    assert (xxl.d_model, xxl.d_ff, xxl.num_heads, xxl.num_layers, xxl.vocab_size) == (
        4096,
        10240,
        64,
        24,
        256384,
    )
    assert UMT5_PRESETS["umt5-xxl"].text_len == 512
    from models.wan.dit.config import PRESETS as DIT_PRESETS

    for card in CARDS:
        text = UMT5_PRESETS[card.components["text_encoder"].preset]
        dit = DIT_PRESETS[card.components["dit"].preset]
        assert (text.text_dim, text.text_len) == (dit.text_dim, dit.text_len), card.model_id


# --------------------------------------------------------------------------------------------
# cache


def test_repeat_prompts_hit_and_encode_once(tiny):
    spy = SpyEncoder(tiny)
    cached = make_cached(spy)
    first = cached.encode(["a red fox", "blue whale", "a red fox"])
    again = cached.encode(["blue whale", "a red fox"])
    assert spy.batches == [["a red fox", "blue whale"]]
    assert (cached.hits, cached.misses) == (2, 2)
    assert (cached.store.hits, cached.store.misses) == (2, 2)
    assert torch.equal(first, tiny.encode(["a red fox", "blue whale", "a red fox"]))
    assert torch.equal(again, first[[1, 0]])


def test_every_key_field_change_misses(tiny):
    store = TextEmbeddingCache()
    base = make_cached(tiny, store)
    base.encode(["a red fox"])
    key = base.key_for("a red fox")
    assert key == CacheKey(
        model_id="wan-tiny-random",
        component="text_encoder",
        weights_version="random-seed-0",
        precision="fp32",
        shape_sig=tiny.shape_sig,
        input_hash=hashlib.sha256(b"a red fox").hexdigest(),
    )
    for name, value in [
        ("model_id", "other"),
        ("component", "text_encoder_2"),
        ("weights_version", "v2"),
        ("precision", "bf16"),
        ("shape_sig", "text_len=8"),
        ("input_hash", "0" * 64),
    ]:
        assert dataclasses.replace(key, **{name: value}) not in store, name

    bf16 = UMT5TextEncoder(
        UMT5TextEncoder.from_preset("umt5-tiny").model.to(torch.bfloat16),
        tiny.tokenizer,
        tiny.text_len,
    )
    shorter = UMT5TextEncoder(tiny.model, tiny.tokenizer, text_len=8)
    variants = [
        make_cached(tiny, store, model_id="other"),
        make_cached(tiny, store, weights_version="v2"),
        make_cached(tiny, store, component="text_encoder_2"),
        make_cached(bf16, store),
        make_cached(shorter, store),
    ]
    for cached in variants:
        out = cached.encode(["a red fox"])
        assert (cached.hits, cached.misses) == (0, 1)
        assert out.shape[1] == cached.encoder.text_len
    base.encode(["a red fox!"])
    assert (base.hits, base.misses) == (0, 2)
    base.encode(["a red fox"])
    assert (base.hits, base.misses) == (1, 2)
    assert len(store) == 7


def test_outputs_are_copies_so_callers_cannot_corrupt_the_cache(tiny):
    cached = make_cached(tiny)
    out = cached.encode(["a red fox"])
    rows = cached(["a red fox"])
    out.zero_()
    rows[0].fill_(7.0)
    assert torch.equal(cached.encode(["a red fox"]), tiny.encode(["a red fox"]))


def test_deterministic_mode_encodes_one_prompt_per_batch(tiny):
    spy = SpyEncoder(tiny)
    cached = make_cached(spy)
    rows = cached(["a", "b", "a", "c"], deterministic=True)
    assert spy.batches == [["a"], ["b"], ["c"]]
    assert [r.shape for r in rows] == [torch.Size([16, 32])] * 4
    assert torch.equal(rows[0], rows[2])
    assert (cached.name, cached.batchable) == ("text_encode", True)


def test_any_get_put_store_can_stand_in_for_the_runtime_cache(tiny):
    class DictStore:
        def __init__(self) -> None:
            self.data: dict[CacheKey, torch.Tensor] = {}
            self.log: list[str] = []

        def get(self, key):
            self.log.append("get")
            return self.data.get(key)

        def put(self, key, value):
            self.log.append("put")
            self.data[key] = value

    store = DictStore()
    cached = make_cached(tiny, store)
    cached.encode(["fox"])
    cached.encode(["fox"])
    assert store.log == ["get", "put", "get"]
    assert list(store.data) == [cached.key_for("fox")]


def test_lru_store_evicts_least_recently_used():
    store = TextEmbeddingCache(max_entries=2)
    keys = [CacheKey("m", "text_encoder", "v", "fp32", "s", str(i)) for i in range(3)]
    store.put(keys[0], torch.zeros(1))
    store.put(keys[1], torch.ones(1))
    assert store.get(keys[0]) is not None  # keys[0] is now the most recent
    store.put(keys[2], torch.ones(1))
    assert [k in store for k in keys] == [True, False, True]
    assert (store.hits, store.misses, store.evictions, len(store)) == (1, 0, 1, 2)
    assert store.get(keys[1]) is None and store.misses == 1
    with pytest.raises(ValueError, match="max_entries must be >= 1, got 0"):
        TextEmbeddingCache(max_entries=0)
