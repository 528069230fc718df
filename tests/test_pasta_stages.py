"""Pasta-SFT and the decode stage: the SFT batch is the interpreter's layout (loss = a hand sum over each stream's
next tokens), Baseline-SFT reduces to plain causal SFT, the CLI chain runs, and bad input is one line, exit 2, no run
folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmx.core.tokenizer import byte_tokenizer
from llmx.core.train.sft.batch import padded
from llmx.core.train.sft.data import Row
from llmx.core.train.sft.encode import encode as plain_encode
from llmx.plugins.pasta import annotate as A
from llmx.plugins.pasta import lang, layout
from llmx.plugins.pasta import sft as S

MODEL = "ref:llama-test"
ROOT = Path(__file__).resolve().parents[1]


def one_error(err: str) -> bool:
    """One ``error:`` line, and nothing else but the zoo's note on building a reference model."""
    lines = [x for x in err.strip().splitlines() if not x.startswith("building ")]
    return len(lines) == 1 and lines[0].startswith("error: ")


@pytest.fixture(scope="module")
def kit():
    tok = byte_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).eval()
    tags = lang.equip(tok, model)
    rows, _ = A.build(lambda s: tok(s, add_special_tokens=False)["input_ids"], A.Options(limit=4, max_chars=500))
    return model, tok, tags, rows


def test_the_sft_batch_loss_is_a_hand_sum_over_each_streams_next_tokens(kit):
    model, tok, tags, rows = kit
    lays = [layout.build(layout.encode(tok, r["prompt"], True), layout.encode(tok, r["response"]), tags, tok.decode,
                         eos=tok.eos_token_id) for r in rows[:2]]
    batch = S.batch(lays, tok.pad_token_id, model, "cpu")
    with torch.no_grad():
        out = model(**batch)
    total, count = 0.0, 0
    for b, lay in enumerate(lays):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([lay.ids]), position_ids=torch.tensor([lay.positions]),
                           attention_mask=lay.visible()[None, None]).logits[0]
        assert torch.allclose(out.logits[b, :len(lay.ids)], logits, atol=1e-5)  # padding changes nothing
        logp = torch.log_softmax(logits.double(), -1)
        for i, t in enumerate(lay.targets):
            if t != layout.IGNORE:
                total -= float(logp[i, t])
                count += 1
    assert sum(t == tags[lang.ASYNC_CLOSE] for lay in lays for t in lay.ids) == sum(r["chunks"] for r in rows[:2])
    assert out.loss.item() == pytest.approx(total / count, rel=1e-5)
    main_after_chunk = [lay.targets[lay.stream.index(1) - 1] for lay in lays]  # the promise's last token
    assert all(t not in (tags[lang.ASYNC_OPEN], layout.IGNORE) for t in main_after_chunk)


def test_baseline_sft_on_stripped_rows_is_plain_causal_sft(kit):
    model, tok, tags, rows = kit
    row = rows[0]
    prompt, response = layout.encode(tok, row["prompt"], True), layout.encode(tok, row["plain"])
    lay = layout.build(prompt, response, tags, tok.decode, eos=tok.eos_token_id)
    n = len(lay.ids)
    assert lay.positions == list(range(n)) and torch.equal(lay.visible(), torch.ones(n, n, dtype=torch.bool).tril())
    mine = S.batch([lay], tok.pad_token_id, model, "cpu")
    enc = plain_encode(tok, Row("x", prompt=row["prompt"], completion=row["plain"]), 4096, 4000)
    assert enc.ids == lay.ids  # the byte tokenizer splits prompt and completion the same either way
    theirs = padded([enc], tok.pad_token_id, "cpu")
    with torch.no_grad():
        assert model(**mine).loss.item() == pytest.approx(model(**theirs).loss.item(), rel=1e-6)
    annotated = layout.build(prompt, layout.encode(tok, row["response"]), tags, tok.decode, eos=tok.eos_token_id)
    assert annotated.positions == list(range(len(annotated.ids)))  # true lengths: positions never jump or overlap
    assert not torch.equal(annotated.visible(), torch.ones(len(annotated.ids), len(annotated.ids)).bool().tril())


def test_the_smoke_chain_annotates_trains_and_decodes(cli, tmp_path):
    r = cli("--json", "run", ROOT / "configs" / "smoke" / "pasta.yaml", "-o", tmp_path)
    assert r.code == 0, r.err
    stages = json.loads(r.out)["stages"]
    annotated, trained, decoded = (s["metrics"] for s in stages)
    assert annotated["rows_validation"] >= 2 and trained["heldout_loss"] < trained["heldout_loss_before"]
    assert decoded["rows"] == 2 and decoded["judge_nll_mean"] > 0
    rows = [json.loads(x) for x in open(decoded["decoded"])]
    assert all(r["promises"] > 0 or r["steps"] == r["tokens"] for r in rows)  # no promise: sequential decoding
    items = [json.loads(x) for x in open(Path(decoded["decoded"]).with_name("prompts.jsonl"))]  # llmx compare's
    assert [i["steps"] for i in items] == [r["steps"] for r in rows] and [i["prompt"] for i in items] == [0, 1]
    assert all(isinstance(i["item"], str) for i in items) and items[0]["item"] != items[1]["item"]
    assert [i["judge_nll"] for i in items if not i["empty"]] == [r["judge_nll"] for r in rows if r["judge_nll"]]
    assert sum(i["judge_nll"] for i in items) / 2 == pytest.approx(decoded["judge_nll"])
    assert sum(i["steps"] for i in items) / 2 == pytest.approx(decoded["steps_mean"])


def test_an_empty_response_is_scored_by_the_judges_nll_of_ending_at_once(kit):
    from llmx.plugins.pasta import decode as D

    model, tok, _, rows = kit
    prompt = rows[0]["prompt"]
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        expected = -torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)[tok.eos_token_id].item()
    (end,) = D.judge_end_nll(model, tok, [prompt])
    assert end == pytest.approx(expected, rel=1e-5)
    decoded = [{"prompt": prompt, "steps": 3, "plain_tokens": 3, "parses": True, "capped": False, "judge_nll": 1.5},
               {"prompt": prompt, "steps": 4, "plain_tokens": 0, "parses": False, "capped": False, "judge_nll": None}]
    items = D.items(decoded, {1: end})
    assert [i["judge_nll"] for i in items] == [1.5, end] and [i["empty"] for i in items] == [False, True]
    assert [i["speedup"] for i in items] == [1.0, 0.25]
    assert "judge_nll" not in D.items([{k: v for k, v in decoded[0].items() if k != "judge_nll"}])[0]  # no judge


@pytest.mark.parametrize("line,words", [
    ({"prompt": "class A:\n", "response": '<promise topic="f" tokens="3"/><async>x'}, "pasta.jsonl:2"),
    ({"prompt": "class A:\n", "response": '<promise topic="f" tokens="three"/><async>x</async><sync/>'},
     "pasta.jsonl:2"),
])
def test_bad_annotated_rows_are_exit_2_without_a_run_folder(cli, tmp_path, line, words):
    good = {"prompt": "class A:\n", "response": '<promise topic="f" tokens="4"/><async>x</async><sync/>'}
    data = tmp_path / "pasta.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    r = cli("train", "--method", "pasta", "--model", MODEL, "--data", data, "--set", "steps=1", "-o", tmp_path / "runs")
    assert r.code == 2 and words in r.err and one_error(r.err), r.err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize("model,words", [(MODEL, "no Pasta-Lang tokens"), ("tiny:mamba2", "needs full attention")])
def test_decode_refuses_a_model_it_cannot_run(cli, tmp_path, model, words):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "class A:\n"}) + "\n")
    r = cli("decode", "--method", "pasta", "--model", model, "--data", data, "-o", tmp_path / "runs")
    assert r.code == 2 and words in r.err and one_error(r.err), r.err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_bonbon_scores_pairs_and_its_loss_widens_the_margin(kit):
    from llmx.plugins.pasta import bonbon as B

    model, tok, tags, rows = kit
    assert B.bonbon_tau(2) == 0.5 and B.bonbon_tau(10) == pytest.approx(1 / (18 * sum(1 / k for k in range(1, 10))))
    lays = [layout.build(layout.encode(tok, r["prompt"], True), layout.encode(tok, r["response"]), tags, tok.decode,
                         eos=tok.eos_token_id) for r in rows[:3]]
    fast_bad = B.Candidate(lays[0], 2.0, False, "x", nll=3.0)
    slow_good = B.Candidate(lays[1], 1.2, True, "y", nll=1.0)
    broken = B.Candidate(None, 5.0, True, "z", nll=0.5)
    assert B.pair([fast_bad, slow_good, broken], 1.0) == (slow_good, fast_bad)  # 1.2 + 0 > 2.0 - 3; broken never pairs
    assert B.pair([fast_bad, slow_good], 0.0) == (fast_bad, slow_good)  # speed alone
    assert B.pair([fast_bad, slow_good], float("inf")) == (slow_good, fast_bad)
    unclean = B.Candidate(lays[0], 3.0, True, "v", clean=False, nll=1.0)  # fastest, but cut or with errors
    assert B.pair([unclean, slow_good], 0.0) is None and B.pair([unclean, slow_good, fast_bad], 0.0) == (fast_bad, slow_good)
    assert B.pair([fast_bad, B.Candidate(lays[2], 2.0, False, "w", nll=3.0)], 1.0) is None  # a tie teaches nothing

    with torch.no_grad():
        logps, counts = B.sequence_logps(model, lays[:2], tok.pad_token_id)
    for lay, got, n in zip(lays[:2], logps, counts, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([lay.ids]), position_ids=torch.tensor([lay.positions]),
                           attention_mask=lay.visible()[None, None]).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        hand = [float(logp[i, t]) for i, t in enumerate(lay.targets) if t != layout.IGNORE]
        assert float(got) == pytest.approx(sum(hand), rel=1e-5) and int(n) == len(hand)

    import copy

    policy = copy.deepcopy(model).train()
    pairs = [(lays[1], lays[0])]
    reference = B.reference_logps(model, pairs, tok.pad_token_id, batch_size=4)  # the policy before the step
    value, stats = B.loss(policy, pairs, reference, tok.pad_token_id, alpha=0.0, tau=0.5)
    assert float(stats["margin"]) == pytest.approx(0.0, abs=1e-5) and float(value.detach()) == pytest.approx(1.0, rel=1e-5)
    opt = torch.optim.SGD(policy.parameters(), lr=1e-3)
    value.backward()
    opt.step()
    after = B.loss(policy, pairs, reference, tok.pad_token_id, alpha=0.0, tau=0.5)[1]["margin"]
    assert float(after) > 0  # IPO pulls the best up and the worst down against the reference


def test_bonbon_refuses_a_model_without_pasta_tokens(cli, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "class A:\n"}) + "\n")
    r = cli("align", "--method", "pasta-bonbon", "--model", MODEL, "--data", data, "-o", tmp_path / "runs")
    assert r.code == 2 and "no Pasta-Lang tokens" in r.err and one_error(r.err), r.err


def test_targets_follow_each_stream(kit):
    model, tok, tags, rows = kit
    for row in rows:
        lay = layout.build(layout.encode(tok, row["prompt"], True), layout.encode(tok, row["response"]), tags,
                           tok.decode, eos=tok.eos_token_id)
        ids, targets = lay.ids, lay.targets
        assert all(t == layout.IGNORE for t in targets[:lay.prompt_len - 1])  # the prompt is not trained
        assert targets[lay.prompt_len - 1] == ids[lay.prompt_len]  # but its last token predicts the response
        assert tags[lang.ASYNC_OPEN] not in targets  # a chunk's <async> is forced, never predicted
        closes = [i for i, t in enumerate(ids) if t == tags[lang.ASYNC_CLOSE]]
        assert all(targets[i] == layout.IGNORE for i in closes) and targets[-1] == layout.IGNORE
        for i, t in enumerate(ids):
            if t == tags[lang.PROMISE_CLOSE]:  # predicts the main token after its chunk's </async>
                end = next(j for j in closes if j > i)
                assert targets[i] == ids[end + 1]


def test_annotated_rows_survive_a_bpe_round_trip():
    from llmx.core.data import stdlib
    from llmx.core.tokenizer import train_bpe

    tok = train_bpe(stdlib.documents("validation")[:40], 500)
    lang.equip(tok)
    rows, _ = A.build(lambda s: tok(s, add_special_tokens=False)["input_ids"], A.Options(limit=30))
    for r in rows:
        for text in (r["prompt"], r["response"]):
            assert tok.decode(layout.encode(tok, text)) == text
        lay = layout.build(layout.encode(tok, r["prompt"], True), layout.encode(tok, r["response"]), lang.ids(tok),
                           tok.decode)
        assert lay.actual == lay.promised == r["chunk_tokens"]


def test_a_prompts_item_is_its_place_name_and_text_not_its_decoding():
    from llmx.plugins.pasta import decode as D

    def decoded(prompt, steps):
        return {"name": "f", "prompt": prompt, "steps": steps, "plain_tokens": 12, "parses": True, "capped": False}

    ids = [r["item"] for r in D.items([decoded("def f():", 10), decoded("def g():", 5)])]
    assert len(set(ids)) == 2
    assert [r["item"] for r in D.items([decoded("def f():", 3), decoded("def g():", 9)])] == ids  # another decoding
    assert D.items([decoded("def h():", 10)])[0]["item"] != ids[0]
