"""CoSD: the loop on scripted models (fixed next-token distributions per context), the exact reductions (alpha = 0
is the draft, alpha > 1 with beta = 0 the assistant), the released rule's difference, cache cropping against the
uncached reference, a byte-tokenizer draft for a BPE assistant, the CART against scikit-learn, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from llmx.core.models.stream import Stream, crop_cache
from llmx.plugins.cosd import cart, loop
from llmx.plugins.cosd.decide import ReleasedRule, Rule, TreeRule

PROMPT = "Q: "
TARGET = "abcdefgh-ijklmnop."
WRONG = "#"


class Scripted(torch.nn.Module):
    """A causal LM whose next-token distribution is a function of the context text: on track (the generated text a
    prefix of TARGET) it puts ``sure`` on the token that continues TARGET where it knows the next character, else
    ``unsure`` on the token of WRONG; done, it ends with EOS; off track, EOS or anything. Its KV cache holds the
    token ids themselves, so the real ``DynamicCache`` is updated and cropped."""

    def __init__(self, tok, known: range, sure: float = 0.9, unsure: float = 0.4):
        super().__init__()
        from transformers import GenerationConfig, PretrainedConfig

        self.tok, self.known, self.sure, self.unsure = tok, known, sure, unsure
        self.vocab = len(tok)
        self.config = PretrainedConfig(num_hidden_layers=1, vocab_size=self.vocab)
        self.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def _next(self, ids: list[int]) -> torch.Tensor:
        text = self.tok.decode(ids, skip_special_tokens=True)
        probs = torch.full((self.vocab,), 1.0)
        g = text[len(PROMPT):] if text.startswith(PROMPT) else None
        if g is not None and TARGET.startswith(g) and len(g) < len(TARGET):
            rest = TARGET[len(g):]
            right = self.tok(rest, add_special_tokens=False)["input_ids"][0]
            wrong = self.tok(WRONG, add_special_tokens=False)["input_ids"][0]
            pick, mass = (right, self.sure) if len(g) in self.known else (wrong, self.unsure)
            probs[pick] = 0.0
            probs *= (1 - mass) / probs.sum()
            probs[pick] = mass
        elif g == TARGET:
            probs *= 0.05 / probs.sum()
            probs[self.tok.eos_token_id] = 0.95
        else:
            probs[self.tok.eos_token_id] = probs.sum()
            probs /= probs.sum()
        return probs.log()

    def forward(self, input_ids, past_key_values=None, use_cache=False, **_):
        from types import SimpleNamespace

        self.calls += 1
        new = input_ids[0].tolist()
        prev: list[int] = []
        if past_key_values is not None:
            layer = past_key_values.layers[0] if past_key_values.layers else None
            if layer is not None and getattr(layer, "is_initialized", False):
                prev = layer.keys[0, 0, :, 0].long().tolist()
            keys = torch.tensor(new, dtype=torch.float32).view(1, 1, -1, 1)
            past_key_values.update(keys, keys.clone(), 0)
        ids = prev + new
        logits = torch.stack([self._next(ids[:len(prev) + i + 1]) for i in range(len(new))])
        return SimpleNamespace(logits=logits[None])


@pytest.fixture(scope="module")
def byte_tok():
    from llmx.core.tokenizer import byte_tokenizer

    return byte_tokenizer()


def _pair(tok_p, tok_q, shared=True, use_cache=True, sure=0.9, unsure=0.4):
    half = TARGET.index("-")
    draft = Scripted(tok_p, range(0, half), sure, unsure)
    assistant = Scripted(tok_q, range(half, len(TARGET)), sure, unsure)
    return loop.Pair(draft, tok_p, assistant, tok_q, shared, use_cache)


SETTINGS = loop.Settings(max_new_tokens=40, draft_tokens=5)


def test_each_model_alone_gets_its_half_and_cosd_rule_fuses_them(byte_tok):
    pair = _pair(byte_tok, byte_tok)
    draft = loop.single(pair.draft, byte_tok, PROMPT, SETTINGS)
    assistant = loop.single(pair.assistant, byte_tok, PROMPT, SETTINGS, role="assistant")
    fused = loop.cosd(pair, PROMPT, Rule(0.5, 0.5), SETTINGS)
    assert draft.text.startswith(TARGET[:TARGET.index("-")]) and draft.text != TARGET
    assert not assistant.text.startswith(TARGET[0])
    assert fused.text == TARGET and fused.stop == "eos"
    assert WRONG not in fused.text  # no draft token outlives a replacement
    assert fused.replacements == len(TARGET) - TARGET.index("-")
    assert fused.assistant_forwards == fused.blocks and fused.draft_forwards > 0
    assert fused.assistant_forwards < fused.tokens


def test_alpha_zero_is_the_draft_and_alpha_above_one_with_beta_zero_is_the_assistant(byte_tok):
    pair = _pair(byte_tok, byte_tok, sure=0.6, unsure=0.45)
    for k in (1, 3, 5):
        s = loop.Settings(max_new_tokens=30, draft_tokens=k)
        assert loop.cosd(pair, PROMPT, Rule(0.0, 0.5), s).text == loop.single(pair.draft, byte_tok, PROMPT, s).text
        assert (loop.cosd(pair, PROMPT, Rule(1.5, 0.0), s).text
                == loop.single(pair.assistant, byte_tok, PROMPT, s, role="assistant").text)


def test_the_released_rule_reads_the_draft_token_and_decides_otherwise(byte_tok):
    pair = _pair(byte_tok, byte_tok)
    paper = loop.cosd(pair, PROMPT, Rule(), SETTINGS)
    released = loop.cosd(pair, PROMPT, ReleasedRule(), SETTINGS)
    assert paper.text == TARGET and released.text != TARGET and released.replacements == 0


def test_the_cached_loop_equals_the_uncached_reference(byte_tok):
    for decision in (Rule(), Rule(0.0), Rule(1.5, 0.0), ReleasedRule()):
        for k in (1, 4):
            s = loop.Settings(max_new_tokens=30, draft_tokens=k)
            cached = loop.cosd(_pair(byte_tok, byte_tok), PROMPT, decision, s)
            plain = loop.cosd(_pair(byte_tok, byte_tok, use_cache=False), PROMPT, decision, s)
            assert (cached.text, cached.replacements, cached.blocks) == (plain.text, plain.replacements, plain.blocks)


def test_crop_keeps_the_prefix_on_the_pinned_transformers():
    from llmx.core import models

    model, _ = models.load("tiny:llama")
    ids = list(range(5, 17))
    cached, plain = Stream(model), Stream(model, use_cache=False)
    for seq, start in ((ids[:6], 6), (ids[:9], 7), (ids[:4] + [3, 4], 3), (ids[:4] + [3, 4, 9], 7), (ids, 1)):
        torch.testing.assert_close(cached.logprobs(seq, start), plain.logprobs(seq, start), atol=1e-5, rtol=0)
        assert cached.cache is None or cached.cache.get_seq_length() == len(seq)
    assert cached.fed < plain.fed
    assert not crop_cache(None, 3) and not crop_cache(cached.cache, 99)


def test_a_byte_tokenizer_draft_pairs_with_a_bpe_assistant(byte_tok):
    from llmx.core import models

    _, bpe = models.load("ref:llama-test")
    assert len(bpe) != len(byte_tok)
    pair = _pair(byte_tok, bpe, shared=False)
    fused = loop.cosd(pair, PROMPT, Rule(), SETTINGS)
    assert fused.text == TARGET and fused.assistant_forwards == fused.blocks
    draft = loop.single(pair.draft, byte_tok, PROMPT, SETTINGS)
    assert loop.cosd(pair, PROMPT, Rule(0.0), SETTINGS).text == draft.text


def test_greedy_lossless_speculative_decoding_equals_the_assistant_alone():
    from llmx.core import models

    d, tok = models.load("ref:llama-test")
    a, tok_a = models.load("ref:opt-test")
    pair = loop.Pair(d, tok, a, tok_a, shared=True)
    s = loop.Settings(max_new_tokens=20, draft_tokens=4)
    for prompt in ("def f(x):\n    return", "import os\n", "class A:\n"):
        alone = loop.single(a, tok_a, prompt, s, role="assistant")
        assert loop.assisted(pair, prompt, s).text == alone.text
        assert loop.cosd(pair, prompt, Rule(1.5, 0.0), s).text == alone.text
        cached, plain = loop.cosd(pair, prompt, Rule(), s), loop.cosd(loop.Pair(d, tok, a, tok_a, True, False),
                                                                       prompt, Rule(), s)
        assert (cached.text, cached.replacements) == (plain.text, plain.replacements)


def test_average_mixes_both_models_every_step(byte_tok):
    pair = _pair(byte_tok, byte_tok)
    out = loop.average(pair, PROMPT, SETTINGS)
    assert out.text == TARGET  # 0.9 on the right token beats 0.4 on the wrong one at every position
    assert out.draft_forwards == out.assistant_forwards == out.tokens
    with pytest.raises(ValueError, match="one tokenizer"):
        loop.average(loop.Pair(pair.draft, byte_tok, pair.assistant, byte_tok, False), PROMPT, SETTINGS)


def test_cart_predictions_match_scikit_learn():
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(0)
    for trial in range(4):
        x = rng.random((300, 2)).astype(np.float32).astype(np.float64)
        y = ((x[:, 0] < 0.3) | (x[:, 1] > 0.7 + 0.1 * rng.standard_normal(300))).astype(int)
        y[rng.random(300) < 0.1] ^= 1
        probe = rng.random((1000, 2)).astype(np.float32).astype(np.float64)
        for depth in (1, 2, 3, 4):
            for balanced in (False, True):
                ours = cart.fit(x, y, max_depth=depth, min_samples_leaf=5, balanced=balanced)
                theirs = DecisionTreeClassifier(max_depth=depth, min_samples_leaf=5, random_state=0,
                                                class_weight="balanced" if balanced else None).fit(x, y)
                assert (ours.predict(probe) == theirs.predict(probe)).all(), (trial, depth, balanced)
                assert ours.depth == theirs.get_depth()


def test_tree_file_round_trip_and_refusals(tmp_path):
    fitted = cart.fit([[0.1, 0.9], [0.8, 0.2], [0.2, 0.7], [0.9, 0.4]], [1, 0, 1, 0])
    cart.save(tmp_path / "t.json", fitted, {"disagreements": 4})
    back, info = cart.load(tmp_path / "t.json")
    assert back.nodes == fitted.nodes and info["disagreements"] == 4
    assert TreeRule(back)(loop.Position(1, 0.1, 2, 0.9, 0.0)) == 2
    assert TreeRule(back)(loop.Position(1, 0.9, 2, 0.3, 0.0)) is None
    cart.save(tmp_path / "f.json", None, {})
    assert cart.load(tmp_path / "f.json")[0] is None
    (tmp_path / "bad.json").write_text(json.dumps({"format": "llmx-cosd-tree", "nodes": [{"feature": 5}]}))
    from llmx.errors import UsageError

    for bad in ("bad.json", "t.json.missing"):
        with pytest.raises(UsageError):
            cart.load(tmp_path / bad)


def test_tree_features_label_disagreements_by_who_is_right(byte_tok):
    from llmx.plugins.cosd.tree import features

    rows = features(_pair(byte_tok, byte_tok), PROMPT, TARGET)
    half = TARGET.index("-")
    assert [label for *_, label in rows] == [0] * half + [1] * (len(TARGET) - half)  # exactly one is right
    assert all((p, q) == pytest.approx((0.9, 0.4)) for p, q, _ in rows[:half])
    assert all((p, q) == pytest.approx((0.4, 0.9)) for p, q, _ in rows[half:])
    both = _pair(byte_tok, byte_tok)
    both.assistant.known = range(len(TARGET))  # both right on the draft's half: no label there
    assert [label for *_, label in features(both, PROMPT, TARGET)] == [1] * (len(TARGET) - half)


def test_cli_decodes_with_the_rule_and_writes_rows(cli, tmp_path):
    r = cli("decode", "--method", "cosd", "--model", "ref:llama-test", "--set", "assistant=ref:opt-test",
            "--set", "task=api-facts", "--set", "limit=2", "--set", "max_new_tokens=8", "--json", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    metrics = r.json()["stages"][0]["metrics"]
    assert metrics["prompts"] == 2 and metrics["decision"] == "rule" and metrics["assistant_forwards_per_token"] < 1
    rows = list((tmp_path / "runs").glob("*/artifacts/*/rows.jsonl"))
    assert len(rows) == 1 and len(rows[0].read_text().splitlines()) == 2


@pytest.mark.parametrize("sets,words", [
    ([], "assistant"),
    (["assistant=ref:opt-tets"], "did you mean"),
    (["assistant=ref:opt-test", "alpha=-0.1"], "alpha"),
    (["assistant=ref:opt-test", "beta=-1"], "beta"),
    (["assistant=ref:opt-test", "decision=tree", "tree=notatree.json"], "not a CoSD tree file"),
])
def test_bad_input_is_exit_2_without_a_run_folder(cli, tmp_path, sets, words):
    (tmp_path / "notatree.json").write_text('{"nodes": []}')
    r = cli("decode", "--method", "cosd", "--model", "ref:llama-test", *[a for s in sets for a in ("--set", s)],
            "-o", tmp_path / "runs")
    assert r.code == 2 and words.lower() in r.err.lower() and len(r.err.strip().splitlines()) <= 2, r.err
    out = tmp_path / "runs"
    assert not out.exists() or list(out.iterdir()) == []


def _wide_qwen2(seed: int):
    """A real-width Qwen2 block (hidden 2048, 16 heads over 2 KV heads, biased q/k/v), one layer, random."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=2048, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval(), tok


def test_a_real_width_gqa_model_with_biases_crops_and_reduces_exactly():
    draft, tok = _wide_qwen2(0)
    assistant, _ = _wide_qwen2(1)
    assert assistant.model.layers[0].self_attn.q_proj.bias is not None
    s = loop.Settings(max_new_tokens=12, draft_tokens=4)
    alone = loop.single(assistant, tok, "def f(x):", s, role="assistant")
    for use_cache in (True, False):
        pair = loop.Pair(draft, tok, assistant, tok, shared=True, use_cache=use_cache)
        assert loop.cosd(pair, "def f(x):", Rule(1.5, 0.0), s).text == alone.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("strategy", ["cosd", "draft", "assistant", "average", "speculative", "ensemble"])
def test_every_strategy_decodes_on_cuda(cli, tmp_path, strategy):
    r = cli("decode", "--method", "cosd", "--model", "ref:llama-test", "--device", "cuda", "--set",
            "assistant=ref:opt-test", "--set", "limit=3", "--set", f"strategy={strategy}", "--json", "-o", tmp_path)
    assert r.code == 0, r.err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cached_loop_equals_the_uncached_one_on_cuda():
    from llmx.core import models

    d, tok = models.load("ref:llama-test", device="cuda")
    a, tok_a = models.load("ref:opt-test", device="cuda")
    s = loop.Settings(max_new_tokens=16, draft_tokens=4)
    runs = [loop.cosd(loop.Pair(d, tok, a, tok_a, True, use_cache), "import os\n", Rule(), s) for use_cache in (True, False)]
    assert runs[0].text == runs[1].text and runs[0].replacements == runs[1].replacements
    assert loop.cosd(loop.Pair(d, tok, a, tok_a, True), "import os\n", Rule(1.5, 0.0), s).text == \
        loop.single(a, tok_a, "import os\n", s, role="assistant").text
