"""The exact buffer of each compressed cache over a prefill and decode steps, as each method's official code keeps it
(Lexico: 97-128 at 128 and 32; KIVI: keys 0..R-1, values R) and as llmx's earlier rule kept it (at least
``buffer_length``); KIVI's key groups with padding left out of their statistics; the lexico comparison's window arm
storing what Lexico stores with its dictionaries counted."""

from __future__ import annotations

import pytest
import torch

from llmx.core import models
from llmx.plugins.lexico.cache import CompressedCache
from llmx.plugins.lexico.codecs import KIVICodec, LexicoCodec

TEXT = "import os\nimport sys\n\ndef run(path):\n    return os.path.join(path, 'x')\n\nclass Point:\n    pass\n"


@pytest.fixture(scope="module")
def setup():
    model, tok = models.load("ref:llama-test")
    return model, tok(TEXT, return_tensors="pt")["input_ids"][:, :40]


def codec_for(kind: str, hd: int):
    d = torch.nn.functional.normalize(torch.randn(hd, 32, generator=torch.Generator().manual_seed(0)), dim=0)
    return (lambda i: LexicoCodec(d, d, 4)) if kind == "lexico" else (lambda i: KIVICodec(2, 4))


# buffer_length 8, chunk 3, KIVI key groups of 4; a 20-token prompt, then 9 tokens one at a time:
# (exact keys, exact values) after the prompt and after each step.
CASES = {
    ("lexico", "official"): [(8, 8)] + [(n, n) for n in (6, 7, 8) * 3],  # 3 leave each time 8 are held
    ("lexico", "at_least"): [(8, 8)] + [(n, n) for n in (9, 10, 8) * 3],  # 3 leave once 11 are held
    ("kivi", "official"): [(4, 8), (5, 8), (6, 8), (7, 8), (0, 8), (1, 8), (2, 8), (3, 8), (4, 8), (5, 8)],
    ("kivi", "at_least"): [(8, 8)] + [(n, n) for n in (9, 10, 11, 8) * 2] + [(9, 9)],  # whole groups of 4
}


@pytest.mark.parametrize("kind,buffer", list(CASES))
def test_exact_buffer_sizes_over_decode_steps(setup, kind, buffer):
    model, ids = setup
    hd = model.config.hidden_size // model.config.num_attention_heads
    cache = CompressedCache(codec_for(kind, hd), model.config.num_hidden_layers, buffer_length=8, chunk=3,
                            buffer=buffer)
    sizes = []
    with torch.no_grad():
        for t in (20, *range(21, 30)):
            model(input_ids=ids[:, (0 if t == 20 else t - 1):t], past_key_values=cache, use_cache=True)
            sizes.append({layer.get_buffer_lengths() for layer in cache.layers})
            assert all(layer.get_seq_length() == t for layer in cache.layers)
    assert sizes == [{s} for s in CASES[kind, buffer]]


def test_official_rules_refuse_what_the_official_code_refuses_and_the_defaults_fit():
    from pydantic import ValidationError

    from llmx.plugins.lexico.config import KIVIParams, LexicoDecodeParams

    with pytest.raises(ValueError, match="whole key groups"):
        CompressedCache(lambda i: KIVICodec(2, 32), 1, buffer_length=48)
    with pytest.raises(ValueError, match="chunk <= buffer_length"):
        CompressedCache(lambda i: LexicoCodec(torch.eye(4), torch.eye(4), 2), 1, buffer_length=4, chunk=8)
    for bad in (lambda: KIVIParams(buffer_length=48, group=32), lambda: LexicoDecodeParams(buffer_length=8, chunk=16)):
        with pytest.raises(ValidationError):
            bad()
    assert (KIVIParams(buffer_length=48).group, KIVIParams(buffer_length=8, buffer="at_least").group) == (16, 32)
    assert (LexicoDecodeParams(buffer_length=8).chunk, LexicoDecodeParams().chunk) == (8, 32)


def greedy_scores(model, ids, mask, cache) -> torch.Tensor:
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                         past_key_values=cache, output_scores=True, return_dict_in_generate=True)
    return torch.stack(out.scores, 1)  # [B, steps, vocab]


def kivi(model, padding=None):
    return CompressedCache(lambda i: KIVICodec(2, 8), model.config.num_hidden_layers, buffer_length=16,
                           attention="dense", padding=padding)


def test_a_left_padded_row_equals_the_sequence_alone_and_padding_stays_out_of_key_groups(setup):
    """KIVI with 8-token key groups, residual 16. Padded by a whole residual, a row of a batch scores as the same
    sequence alone (the key groups of padding alone hold no statistics). Padded by 3 (a key group shared with real
    tokens), the padding's content changes nothing once the cache is told the padding, and changes the row's scores
    when it is not (the padding's keys enter the group's min and max)."""
    model, ids = setup
    seq = ids[:, :24]
    alone = greedy_scores(model, seq, torch.ones_like(seq), kivi(model))

    def padded(pad: int, pad_id: int, told: bool) -> torch.Tensor:
        batch = torch.cat([torch.cat([torch.full((1, pad), pad_id), seq], 1), ids[:, -24 - pad:]], 0)
        mask = torch.ones_like(batch)
        mask[0, :pad] = 0
        return greedy_scores(model, batch, mask, kivi(model, mask if told else None))[0]

    assert torch.allclose(padded(16, 5, True), alone[0], atol=1e-4)
    assert torch.equal(padded(3, 5, True), padded(3, 300, True))
    assert (padded(3, 5, False) - padded(3, 300, False)).abs().max() > 1e-4


def test_the_window_arm_stores_what_lexico_s8_stores_with_its_dictionaries():
    """``llmx compare lexico``'s cost axis counts Lexico's dictionaries (over ``amortize_batch`` sequences); its
    window arm keeps as many tokens as that: caches fed ref:llama-long's KV shape (one layer: both sides scale with
    the layers) for the comparison's prefill and decode steps store the same bytes within one token's."""
    from llmx.core.plugins import host
    from llmx.plugins.lexico.cache import WindowCache
    from llmx.plugins.lexico.plugin import DICTIONARY, EVAL, HEAD_DIM, KV_HEADS, SINKS, window_like_lexico

    spec = host().comparison("lexico")
    assert spec.cost_key == "kv_memory_fraction_amortised"
    assert spec.arm("window").stages[0]["params"]["window"] == window_like_lexico(8)
    gen = torch.Generator().manual_seed(0)
    d = [torch.nn.functional.normalize(torch.randn(HEAD_DIM, DICTIONARY["atoms"], generator=gen), dim=0)
         for _ in range(2)]
    lexico = CompressedCache(lambda i: LexicoCodec(*d, 8), 1, EVAL["buffer_length"], EVAL["chunk"])
    window = WindowCache(1, window_like_lexico(8), SINKS)
    for cache in (lexico, window):
        for n in (EVAL["context_len"], *[1] * (EVAL["continuation_len"] - 1)):
            cache.update(*torch.randn(2, 1, KV_HEADS, n, HEAD_DIM, generator=gen), 0)
    token = 2 * KV_HEADS * HEAD_DIM * 2  # one token of the fp16 cache
    cost = lexico.stored_bytes() + lexico.dictionary_bytes() / EVAL["amortize_batch"]
    assert lexico.dictionary_bytes() >= 2 * HEAD_DIM * DICTIONARY["atoms"] * 4
    assert abs(window.stored_bytes() - cost) < token


def test_padding_given_on_another_device_than_the_keys_is_moved_to_theirs():
    """The prompt's mask may sit on the CPU while the model runs on an accelerator: the key groups' padding test is
    made on the keys' device (``meta`` stands in for CUDA here: a CPU mask on it raises as on CUDA)."""
    padding = torch.ones(2, 20, dtype=torch.long)
    padding[0, :3] = 0
    cache = CompressedCache(lambda i: KIVICodec(2, 4), 1, buffer_length=8, padding=padding)
    keys = torch.empty(2, 2, 20, 16, device="meta")
    cache.update(keys, keys, 0)
    layer = cache.layers[0]
    assert layer.compressed_keys == 16 and all(t.device.type == "meta" for t in layer.key_codes)


def test_kivi_bits_given_as_text_on_the_command_line(cli, tmp_path):
    """``--set bits=4`` arrives as text: accepted as the int 4; a width KIVI does not pack is a config error."""
    ok = cli("--json", "--dry-run", "decode", "--method", "kivi", "--model", "tiny:llama", "--set", "bits=4",
             "-o", tmp_path)
    assert ok.code == 0, ok.err
    bad = cli("decode", "--method", "kivi", "--model", "tiny:llama", "--set", "bits=3", "-o", tmp_path)
    assert bad.code == 2 and "bits" in bad.err


def test_lexico_decode_without_a_dictionary_is_refused_before_any_work(cli, tmp_path):
    """No --set dictionary and no lexico train stage before it: a config error (exit 2), no run folder."""
    r = cli("decode", "--method", "lexico", "--model", "tiny:llama", "-o", tmp_path / "runs")
    assert r.code == 2 and "dictionary" in r.err and not (tmp_path / "runs").exists()
