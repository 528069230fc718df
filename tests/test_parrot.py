"""Parrot's MoE inside the HF LLaVA class, its stages and artifact, and the MMMB reader, generator and scorer."""

from __future__ import annotations

import base64
import csv
import inspect
import io
import json
import math
import random

import pytest
import torch

from llmx.core.multimodal import languages as L
from llmx.core.multimodal import qa
from llmx.core.multimodal.adapter import AdaptedLlava
from llmx.plugins.parrot import mmmb
from llmx.plugins.parrot.moe import MultilingualMoE


def _model(folder, seed: int = 0, **moe):
    from llmx.core.multimodal.model import load

    model, proc = load(folder, torch.float32, "cpu")
    torch.manual_seed(seed)
    return AdaptedLlava.adopt(model, MultilingualMoE(model.config.text_config.hidden_size, **moe)).eval(), proc


def _batch(proc, convs, model):
    from llmx.core.multimodal.batch import collate, examples
    from llmx.core.multimodal.model import image_tokens

    return collate(examples(proc, convs, image_tokens(model), 512), proc.tokenizer.pad_token_id, "cpu")


def _convs(count=4, langs=None, seed=0):
    return qa.conversations(count, "train", seed, langs or {"en": 1, "zh": 1}, {"open": 1, "choice": 1})


def _hand_moe(moe: MultilingualMoE, v: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's output by the notes' §2.1, term by term: (g, sum_e g_e Expert_e(V) + 0.1 V)."""
    q = v[0]
    a = torch.softmax(text @ q / math.sqrt(v.shape[-1]), dim=0)
    t = a @ text
    g = torch.softmax(moe.gate.weight @ t, dim=0)
    out = 0.1 * v
    for e, ex in enumerate(moe.experts):
        out = out + g[e] * (ex.down_proj.weight @ (torch.nn.functional.silu(ex.gate_proj.weight @ v.T)
                                                    * (ex.up_proj.weight @ v.T))).T
    return g, out


def test_stage_1_is_an_exact_identity(tiny_llava, tmp_path):
    from llmx.core.multimodal.model import load

    folder = tiny_llava(tmp_path / "m")
    plain, proc = load(folder, torch.float32, "cpu")
    model, _ = _model(folder, use_moe=False)
    batch = _batch(proc, _convs(), model)
    with torch.no_grad():
        assert torch.equal(plain.eval()(**batch).logits, model(**batch).logits)
        model.visual_adapter.use_moe = True
        assert not torch.allclose(plain(**batch).logits, model(**batch).logits)


def test_stage_2_features_are_the_gated_expert_sum_plus_a_tenth_of_v(tiny_llava, tmp_path):
    folder = tiny_llava(tmp_path / "m")
    model, proc = _model(folder)
    batch = _batch(proc, _convs(), model)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    with torch.no_grad():
        embeds = model.adapted_embeds(ids, batch["pixel_values"], mask, labels)
        plain = model.get_input_embeddings()(ids)
        feats = model.image_features(batch["pixel_values"], plain.dtype)
        gates = model.visual_adapter.routing(feats, plain, model.text_mask(ids, mask, labels))
    assert torch.allclose(gates.sum(-1), torch.ones(len(ids)))
    for r in range(len(ids)):
        text = plain[r][(ids[r] != model.config.image_token_id) & mask[r].bool() & (labels[r] == -100)]
        g, want = _hand_moe(model.visual_adapter, feats[r], text)
        assert torch.allclose(gates[r], g, atol=1e-6)
        assert torch.allclose(embeds[r][ids[r] == model.config.image_token_id], want, atol=1e-5)


def test_answer_tokens_change_neither_the_gates_nor_the_features_and_question_tokens_do(tiny_llava, tmp_path):
    model, proc = _model(tiny_llava(tmp_path / "m"))
    batch = _batch(proc, _convs(2), model)
    ids, labels = batch["input_ids"], batch["labels"]
    answer = labels != -100
    other = ids.clone()
    other[answer] = (ids[answer] + 7) % 200 + 40  # other answer tokens, same positions
    question = (labels == -100) & batch["attention_mask"].bool() & (ids != model.config.image_token_id)
    asked = ids.clone()
    asked[question.nonzero()[3:6].unbind(1)] = 50  # a few question tokens changed
    image = ids == model.config.image_token_id
    with torch.no_grad():
        a, b, c = (model.adapted_embeds(x, batch["pixel_values"], batch["attention_mask"], labels)[image]
                   for x in (ids, other, asked))
    assert not torch.equal(ids, other) and torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_one_image_asked_in_two_languages_gets_two_routings(tiny_llava, tmp_path):
    from llmx.plugins.parrot.routing import gates

    model, proc = _model(tiny_llava(tmp_path / "m"))
    scene = qa.scenes(1, "test", 0)[0]
    prompts = []
    for lang in ("en", "zh"):
        asked = qa.question(scene, random.Random(0), lang, "open").question
        prompts.append(f"USER: {'<image>' * 17}\n{asked} ASSISTANT:")
    g = gates(model, proc, prompts, [scene, scene])
    assert torch.allclose(g.sum(-1), torch.ones(2)) and (g[0] - g[1]).abs().max() > 1e-4


def test_top_k_of_every_expert_is_soft_mixing_and_top_1_is_one_expert():
    torch.manual_seed(0)
    soft = MultilingualMoE(16, experts=4)
    v, text, mask = torch.randn(3, 5, 16), torch.randn(3, 7, 16), torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    every = MultilingualMoE(16, experts=4, top_k=4)
    one = MultilingualMoE(16, experts=4, top_k=1)
    every.load_state_dict(soft.state_dict())
    one.load_state_dict(soft.state_dict())
    assert torch.equal(soft(v, text, mask), every(v, text, mask))
    g, g1 = soft.routing(v, text, mask), one.routing(v, text, mask)
    assert torch.equal(g1.argmax(-1), g.argmax(-1)) and torch.equal(g1.max(-1).values, torch.ones(3))
    k = int(g[0].argmax())
    assert torch.allclose(one(v, text, mask)[0], one.experts[k](v[0]) + 0.1 * v[0], atol=1e-6)
    with pytest.raises(ValueError, match="top_k"):
        MultilingualMoE(16, experts=4, top_k=5)


def test_masked_text_tokens_do_not_reach_the_router():
    torch.manual_seed(0)
    moe = MultilingualMoE(16, experts=3)
    v, text = torch.randn(1, 5, 16), torch.randn(1, 6, 16)
    mask = torch.tensor([[True, True, True, False, False, False]])
    changed = text.clone()
    changed[0, 3:] = torch.randn(3, 16)
    assert torch.equal(moe.routing(v, text, mask), moe.routing(v, changed, mask))
    assert not torch.equal(moe.routing(v, text, mask), moe.routing(v, changed, torch.ones_like(mask)))


def test_text_only_rows_add_exactly_zero_and_use_every_moe_parameter(tiny_llava, tmp_path):
    from llmx.core.multimodal.conversations import Conversation
    from llmx.core.multimodal.model import load

    folder = tiny_llava(tmp_path / "m")
    plain, proc = load(folder, torch.float32, "cpu")
    model, _ = _model(folder)
    text_only = [Conversation("t", [{"role": "user", "content": "What is two plus two?"},
                                    {"role": "assistant", "content": "four"}])]
    batch = _batch(proc, text_only, model)
    model.train()
    loss = model(**batch).loss
    loss.backward()
    assert loss.item() == plain.train()(**batch).loss.item()
    assert all(p.grad is not None for p in model.visual_adapter.parameters())
    mixed = _batch(proc, [*_convs(2), *text_only], model)  # images for some rows only
    model.zero_grad()
    model(**mixed).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.visual_adapter.parameters())


def test_the_saved_folder_reloads_the_same_logits_in_llmx_and_is_refused_by_plain_transformers(tiny_llava, tmp_path):
    from transformers import AutoModelForImageTextToText, LlavaForConditionalGeneration

    import llmx
    from llmx.core import models
    from llmx.core.multimodal.model import load
    from llmx.errors import UsageError

    model, proc = _model(tiny_llava(tmp_path / "m"), top_k=2)
    with torch.no_grad():
        for p in model.visual_adapter.parameters():  # as if trained
            p.add_(0.01 * torch.randn_like(p))
    batch = _batch(proc, _convs(), model)
    out = models.save(model, proc, tmp_path / "saved", {"method": "parrot"})
    spec = json.loads((out / "visual_adapter.json").read_text())
    assert spec["layer"] == "parrot_moe" and spec["projector"] == "mlp2x_gelu" and spec["top_k"] == 2
    again, _ = load(out, torch.float32, "cpu")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, again.eval()(**batch).logits)
    for cls in (LlavaForConditionalGeneration, AutoModelForImageTextToText):  # without the MoE it would differ
        with pytest.raises(ValueError, match=r"llmx-only folder: its visual adapter .*llmx\.load\(folder\)"):
            cls.from_pretrained(out, local_files_only=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlavaForConditionalGeneration"]
    api_model, _ = llmx.load(str(out))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, api_model.eval()(**batch).logits)
    assert not hasattr(api_model.config, "transformers_weights")
    with pytest.raises(UsageError, match="llmx-only folder"):  # as from the hub: the MoE would be dropped
        load(out, torch.float32, "cpu", local=False)
    for edit, phrase in (({"hidden_size": 64}, "width 64"), ({"projector": "mlp2x_relu"}, "mlp2x_relu projector"),
                         ({"experts": 5}, "size mismatch|Missing|Unexpected")):
        (out / "visual_adapter.json").write_text(json.dumps({**spec, **edit}))
        with pytest.raises(UsageError, match=phrase):
            load(out, torch.float32, "cpu")
    (out / "visual_adapter.json").write_text(json.dumps({**spec, "layer": "nope"}))
    with pytest.raises(UsageError, match="provided by no installed plugin"):
        load(out, torch.float32, "cpu")


def test_stages_1_then_2_train_what_the_official_scripts_train(cli, tiny_llava, tmp_path):
    folder = tiny_llava(tmp_path / "m", "llama")
    runs = tmp_path / "runs"
    common = ["--set", "steps=2", "--set", "batch_size=2", "--set", "eval_rows=2", "--set", 'scenes={"count": 6}',
              "--set", "routing_scenes=2", "-o", runs]
    r = cli("--json", "train", "--method", "parrot", "--model", folder, "--set", "stage=1", *common)
    assert r.code == 0, r.err
    one = r.json()["stages"][0]["metrics"]
    assert one["lr"] == 1e-3 and not one["moe_on"] and one["moe_params"] == 0 and "routing_language_accuracy" not in one
    assert one["trainable_params"] == sum(t.numel() for k, t in _weights(folder).items() if "projector" in k)
    stage1 = one["model_dir"]
    assert not (tmp_path / stage1 / "visual_adapter.json").exists()  # the MoE is off in stage 1: a plain LLaVA
    r = cli("--json", "train", "--method", "parrot", "--model", stage1, "--set", "stage=2", *common)
    assert r.code == 0, r.err
    two = r.json()["stages"][0]["metrics"]
    tower = sum(t.numel() for k, t in _weights(folder).items() if "vision_tower" in k)
    total = sum(t.numel() for t in _weights(folder).values())
    assert two["lr"] == 2e-5 and two["moe_on"] and two["trainable_params"] == total - tower + two["moe_params"]
    assert 0 <= two["routing_language_accuracy"] <= 1 and 0 <= two["routing_language_accuracy_init"] <= 1
    routing = json.loads((tmp_path / two["model_dir"]).parent.joinpath("routing.json").read_text())
    assert set(routing["trained"]["mean_gates"]) == set(L.LANGUAGES)
    r = cli("train", "--method", "parrot", "--model", two["model_dir"], "--set", "stage=1", *common)
    assert r.code == 2 and "stage 1 would switch it off" in r.err
    r = cli("train", "--method", "parrot", "--model", two["model_dir"], "--set", "experts=4", *common)
    assert r.code == 2 and "experts 6 (asked 4)" in r.err


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_a_llava_hf_folder_with_the_default_strategy_gets_cls_back_in_stage_1_and_runs_end_to_end(cli, tiny_llava,
                                                                                                   tmp_path):
    folder = tiny_llava(tmp_path / "hf", strategy="default")
    runs = tmp_path / "runs"
    r = cli("--json", "eval", "--method", "mmmb", "--model", folder, "--set", "count=2", "-o", runs)
    assert r.code == 0, r.err  # the baseline as published: 16 tokens, no CLS
    train = ["train", "--method", "parrot", "--model", folder, "--set", "steps=2", "--set", "batch_size=2", "--set",
             "eval_rows=2", "--set", 'scenes={"count": 4}', "--set", "routing_scenes=0", "-o", runs]
    r = cli(*train)  # stage 2 would feed CLS to the projector trained without it
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "trained without it" in r.err, r.err
    assert "--set stage=1" in r.err and not list(runs.glob("*/artifacts/*parrot*/model"))
    r = cli("--json", *train, "--set", "stage=1")
    assert r.code == 0, r.err
    out = r.json()["stages"][0]["metrics"]
    assert out["strategy_switched"] and out["image_tokens"] == 17
    saved = tmp_path / out["model_dir"]
    assert json.loads((saved / "config.json").read_text())["vision_feature_select_strategy"] == "full"
    from transformers import AutoProcessor

    from llmx.core.multimodal.scenes import scenes

    proc = AutoProcessor.from_pretrained(saved, local_files_only=True)
    batch = proc(images=[scenes(1, "test", 0)[0].image()], text=["USER: <image>\nHi ASSISTANT:"], return_tensors="pt")
    assert int((batch["input_ids"] == proc.tokenizer.convert_tokens_to_ids("<image>")).sum()) == 17
    r = cli("--json", "eval", "--method", "mmmb", "--model", saved, "--set", "count=3", "--set", 'languages=["ar"]',
            "-o", runs)
    assert r.code == 0, r.err
    assert r.json()["stages"][0]["metrics"]["questions"] == 3


def test_stage_1_then_2_in_one_run_takes_a_default_strategy_folder(tiny_llava, tmp_path):
    from llmx import api

    common = {"steps": 2, "batch_size": 2, "eval_rows": 0, "scenes": {"count": 4}, "routing_scenes": 0, "save": False}
    out = api.run({"model": str(tiny_llava(tmp_path / "hf", strategy="default")), "threads": 1, "seed": 0,
                   "pipeline": [{"method": "parrot", "params": {"stage": 1, **common}},
                                {"method": "parrot", "params": {"stage": 2, **common}}]}, output_dir=tmp_path / "runs")
    one, two = (s["metrics"] for s in out["stages"])
    assert one["strategy_switched"] and not two["strategy_switched"] and two["moe_on"] and two["image_tokens"] == 17


def test_generated_mmmb_round_trips_with_the_same_questions_in_every_language(tmp_path):
    from llmx.core.multimodal.scenes import scenes

    mmmb.write(tmp_path, 12, 3, list(L.LANGUAGES))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"mmmb_{c}.tsv" for c in sorted(mmmb.CODES)]
    items = mmmb.read(tmp_path)
    by_lang = {lang: [it for it in items if it.language == lang] for lang in L.LANGUAGES}
    asked = [by_lang["en"][g[0]] for g in mmmb.questions(by_lang["en"], True)]
    assert len(asked) == 12 and all(len(v) == sum(len(q.options) for q in asked) for v in by_lang.values())
    for k, en in enumerate(by_lang["en"]):  # every row (rotated copies too) the same in every language
        same = [by_lang[lang][k] for lang in L.LANGUAGES]
        assert len({(it.answer, it.category, len(it.options), it.image) for it in same}) == 1
        assert len({it.question for it in same}) == 6
        assert en.options[en.answer] in {L.answer("en", en.category, v) for v in qa._values(en.category)}
    assert len({it.category for it in asked}) >= 5
    assert {len(it.options) for it in items} == {2, 4}
    shown = scenes(12, "test", 3 + 2000)[0].pixels()
    assert (torch.tensor(list(by_lang["zh"][0].pil().getdata())).reshape(32, 32, 3).numpy() == shown).all()
    zh = by_lang["zh"][0].prompt()
    assert zh.startswith(by_lang["zh"][0].question) and zh.endswith("请直接用给定选项中的选项字母回答。")
    assert "\nA. " in zh and mmmb.read(tmp_path, ["ar"]) == by_lang["ar"]
    alone = mmmb.read(mmmb.write(tmp_path / "b", 12, 3, ["en"])[0])  # the same set whichever languages are written
    assert [(it.question, it.options, it.answer, it.image) for it in alone] == \
        [(it.question, it.options, it.answer, it.image) for it in by_lang["en"]]


def test_replies_are_read_as_parrot_and_vlmevalkit_do():
    en = mmmb.Item("f:2", "0", "en", "What colour is the three?", None, ("red", "blue", "green", "white"), 1, "colour",
                   b"")
    zh = mmmb.Item("f:2", "0", "zh", "数字三是什么颜色？", None, ("红色", "蓝色", "绿色", "白色"), 1, "colour", b"")
    replies = ["B", "(C)", "The answer is D.", "Answer: B) blue", "blue", "I think A is right and so is B",
               "A. The colour is red here"]
    assert mmmb.score([en] * len(replies), replies)[0] == [1, 2, 3, 1, 1, None, 0]  # no article rule (VERBOSE only)
    assert mmmb.score([zh] * 4, ["答案是 B", "B", "绿色", "A 和 C"])[0] == [1, 1, 2, None]
    assert mmmb.postprocess("The answer is option C.", en.prompt()) == "C"
    assert mmmb.postprocess("The answer is option C.", zh.prompt()) == "The answer is option C."  # not stripped


def test_generated_letters_are_balanced_and_a_constant_letter_scores_zero_under_circular_eval(tmp_path):
    from collections import Counter

    mmmb.write(tmp_path, 60, 0, ["en", "tr"])
    items = mmmb.read(tmp_path)
    groups = mmmb.questions(items, True)
    assert mmmb.circular(tmp_path, items) and len(groups) == 120
    for n in (2, 4):  # each letter right equally often among the questions offering it
        right = Counter("ABCD"[it.answer] for it in items if len(it.options) == n)
        assert len(right) == n and len(set(right.values())) == 1, right
    for g in groups:  # a question's rows: its options rotated, the same right option at each letter once
        first = items[g[0]]
        assert int(first.index) < mmmb.CIRCLE and len(g) == len(first.options)
        assert sorted(items[i].answer for i in g) == list(range(len(g)))
        assert {items[i].options[items[i].answer] for i in g} == {first.options[first.answer]}
        assert all(sorted(items[i].options) == sorted(first.options) and items[i].image == first.image for i in g)
    oracle = mmmb.score(items, ["ABCD"[it.answer] for it in items])[1]
    assert mmmb.grouped(items, oracle, True)[1] == [1.0] * 120
    for letter in "ABCD":
        scores = mmmb.score(items, [letter] * len(items))[1]
        assert sum(scores) > 0 and mmmb.grouped(items, scores, True)[1] == [0.0] * 120


def test_likelihood_scoring_picks_the_option_a_planted_model_prefers_in_every_rotation(tiny_llava, tmp_path):
    from llmx.plugins.parrot import likelihood

    model, proc = _model(tiny_llava(tmp_path / "m"))
    mmmb.write(tmp_path / "gen", 1, 0, ["en", "zh"])
    items = mmmb.read(tmp_path / "gen")  # one colour question, four rotations, in two languages
    assert len(items) == 8 and len({frozenset(it.options) for it in items}) == 2
    tok, eos = proc.tokenizer, proc.tokenizer.eos_token_id
    for wanted in items[0].options + items[4].options:
        bias = torch.zeros(model.config.text_config.vocab_size)
        bias[tok(wanted, add_special_tokens=False)["input_ids"]] = 10.0  # every token of this option likely
        hook = model.lm_head.register_forward_hook(lambda _m, _i, out, b=bias: torch.zeros_like(out) + b)
        try:
            scores = likelihood.loglikelihoods(model, proc, items, batch_size=3)
        finally:
            hook.remove()
        mine = [it for it in items if wanted in it.options]
        assert [it.options[likelihood.pick(v)] for it, v in zip(items, scores, strict=True) if it in mine] == [wanted] * 4
        logp = torch.log_softmax(bias, -1)
        for it, v in zip(items, scores, strict=True):  # the reply as the template writes it (" " + option + "</s>"), no more
            assert v == pytest.approx([float(logp[tok(f" {o}", add_special_tokens=False)["input_ids"] + [eos]].sum())
                                       for o in it.options], rel=1e-5)


def test_mmmb_by_likelihood_runs_end_to_end(cli, tiny_llava, tmp_path):
    from pathlib import Path

    r = cli("--json", "eval", "--method", "mmmb", "--model", tiny_llava(tmp_path / "m"), "--set", "count=3",
            "--set", 'languages=["en", "ru"]', "--set", "scoring=likelihood", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["scoring"] == "likelihood" and m["circular"] and m["questions"] == 6 and m["unanswered"] == 0
    folder = next(Path(tmp_path / "runs").glob("*/artifacts/0_mmmb"))
    answers = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == m["rows"] and all(len(a["loglikelihoods"]) in (2, 4) for a in answers)
    assert all("A. " not in a["prompt"] for a in answers)  # the question alone: no lettered options


def test_routing_decodes_planted_languages_and_averages_each_question_over_its_rotations(tiny_llava, tmp_path):
    from llmx.core.multimodal.model import IMAGE_TOKEN
    from llmx.plugins.parrot import routing

    langs, halves = ["en"] * 4 + ["ar"] * 4, [0, 1] * 4
    noise = 0.01 * torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    planted = torch.tensor([[0.7, 0.1, 0.2]] * 4 + [[0.1, 0.2, 0.7]] * 4) + noise
    r = routing.decode(planted, langs, halves)
    assert r["language_accuracy"] == 1.0 and r["chance"] == 0.5 and r["top_expert"] == {"en": 0, "ar": 2}
    assert routing.decode(torch.ones(8, 3) / 3, langs, halves)["language_accuracy"] == 0.5  # no signal: chance

    model, proc = _model(tiny_llava(tmp_path / "m"))
    mmmb.write(tmp_path / "gen", 4, 0, ["en", "zh"])
    items = mmmb.read(tmp_path / "gen")
    contents = [f"{IMAGE_TOKEN}\n{it.prompt()}" for it in items]
    questions = mmmb.questions(items, True)
    r = routing.by_question(model, proc, contents, [mmmb.Picture(it) for it in items], [it.language for it in items],
                            questions)
    g = routing.gates(model, proc, routing.rendered(model, proc, contents), [it.pil() for it in items])
    for lang in ("en", "zh"):  # each question's rows (its rotations) averaged, then the questions
        mine = [torch.stack([g[i] for i in q]).mean(0) for q in questions if items[q[0]].language == lang]
        assert r["mean_gates"][lang] == pytest.approx(torch.stack(mine).mean(0).tolist(), abs=1e-4)
    assert 0 <= r["language_accuracy"] <= 1 and r["chance"] == 0.5
    assert routing.by_question(model, proc, contents[:8], [mmmb.Picture(it) for it in items[:8]],
                               [it.language for it in items[:8]],
                               mmmb.questions(items[:8], True)) is None  # one language: nothing to decode


def test_mmmb_reports_routing_only_for_a_model_with_the_moe_on(cli, tiny_llava, tmp_path):
    from pathlib import Path

    from llmx.core import models

    model, proc = _model(tiny_llava(tmp_path / "m"))
    saved = models.save(model, proc, tmp_path / "parrot")
    common = ["--set", "count=4", "--set", 'languages=["en", "zh", "ar"]', "--set", "max_new_tokens=2"]
    r = cli("--json", "eval", "--method", "mmmb", "--model", saved, *common, "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert 0 <= m["routing_language_accuracy"] <= 1 and m["routing_chance"] == pytest.approx(1 / 3)
    assert [x.split(":")[0] for x in m["routing_top_expert"].split()] == ["en", "zh", "ar"]
    folder = next(Path(tmp_path / "runs").glob("*/artifacts/0_mmmb"))
    assert set(json.loads((folder / "routing.json").read_text())["mean_gates"]) == {"en", "zh", "ar"}
    r = cli("--json", "eval", "--method", "mmmb", "--model", tmp_path / "m", *common, "-o", tmp_path / "plain")
    assert r.code == 0, r.err
    assert not any(k.startswith("routing") for k in r.json()["stages"][0]["metrics"])  # no MoE: skipped


def _tsv(path, rows, columns=mmmb.COLUMNS):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(columns)
        w.writerows(rows)
    return path


def _questions(folder, count):
    """The generated set's English rows without their rotated copies."""
    mmmb.write(folder, count, 0, ["en"])
    rows = list(csv.DictReader(open(folder / "mmmb_en.tsv", encoding="utf-8"), delimiter="\t"))
    return [r for r in rows if int(r["index"]) < mmmb.CIRCLE]


def test_real_tsv_layouts_hints_and_shared_images_are_read(tmp_path):
    mmmb.write(tmp_path / "gen", 2, 0, ["en"])
    rows = list(csv.reader(open(tmp_path / "gen" / "mmmb_en.tsv", encoding="utf-8"), delimiter="\t"))
    first = dict(zip(rows[0], rows[1], strict=True))
    f = _tsv(tmp_path / "mmbench_dev_en.tsv", [
        [first["index"], first["question"], "Look closely.", first["A"], first["B"], first["C"], first["D"],
         first["answer"], first["category"], first["image"]],
        ["7", "Same picture?", "", "yes", "no", "", "", "A", "other", first["index"]]])  # the image by index
    a, b = mmmb.read(f)
    assert a.prompt().startswith("Look closely.\n" + first["question"]) and a.image == b.image and b.hint is None


@pytest.mark.parametrize("edit, phrase", [
    ({"answer": "E"}, "answer 'E' is not one of the options' letters A, B"),
    ({"answer": ""}, "answer '' is not one of"),
    ({"image": "bm90IGFuIGltYWdl" * 8}, "not a base64-encoded picture"),
    ({"B": ""}, "leave a gap"),
])
def test_bad_mmmb_rows_are_one_line_errors_naming_the_row(cli, tmp_path, tiny_llava, edit, phrase):
    png = io.BytesIO()
    qa.scenes(1, "test", 0)[0].image().save(png, format="PNG")
    good = {"index": "0", "question": "Q?", "hint": "", "A": "red", "B": "blue", "C": "green", "D": "",
            "answer": "B", "category": "colour", "image": base64.b64encode(png.getvalue()).decode()}
    bad = {**good, "index": "1", **edit}
    f = _tsv(tmp_path / "mmmb_pt.tsv", [list(good.values()), list(bad.values())], list(good))
    runs = tmp_path / "runs"
    r = cli("eval", "--method", "mmmb", "--model", tiny_llava(tmp_path / "m"), "--data", f, "-o", runs)
    assert r.code == 2 and f"{f}:3: " in r.err.strip().splitlines()[0] and phrase in r.err, r.err
    assert not list(runs.glob("*/artifacts/*/*"))


def test_tsv_names_and_columns_are_checked(tmp_path):
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match=r"_\{en,cn,pt,ar,tr,ru\}\.tsv"):
        mmmb.read(_tsv(tmp_path / "mmmb_xx.tsv", []))
    with pytest.raises(UsageError, match="mmmb_en.tsv:1: missing column\\(s\\) answer"):
        mmmb.read(_tsv(tmp_path / "mmmb_en.tsv", [], ("index", "image", "question", "A", "B")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no MMMB-format"):
        mmmb.read(tmp_path / "empty")


def test_params_are_checked(cli, tmp_path):
    for setting, phrase in (("top_k=7", "top_k 7 is more than experts 6"), ("routing_scenes=1", "routing_scenes"),
                            ("experts=0", "experts")):
        r = cli("train", "--method", "parrot", "--model", "ref:llava-test", "--set", setting, "-o", tmp_path)
        assert r.code == 2 and phrase in r.err, r.err
    r = cli("eval", "--method", "mmmb", "--model", "ref:llava-test", "--set", 'languages=["xx"]', "-o", tmp_path)
    assert r.code == 2 and "languages: xx" in r.err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parrot_trains_saves_and_answers_on_cuda(tmp_path):
    from llmx import api

    out = api.run({"model": "ref:llava-test", "threads": 1, "seed": 0, "device": "cuda", "dtype": "bfloat16",
                   "pipeline": [{"method": "parrot", "params": {"stage": 1, "steps": 2, "batch_size": 2,
                                                                "eval_rows": 2, "scenes": {"count": 8}}},
                                {"method": "parrot", "params": {"stage": 2, "steps": 2, "batch_size": 2, "eval_rows": 2,
                                                                "scenes": {"count": 8}, "routing_scenes": 4}},
                                {"method": "mmmb", "params": {"count": 4}}]},
                  output_dir=tmp_path / "runs")
    metrics = [s["metrics"] for s in out["stages"]]
    assert math.isfinite(metrics[1]["heldout_loss"]) and metrics[2]["questions"] == 24


def test_a_forward_with_labels_never_lets_the_router_read_the_answers(tiny_llava, tmp_path):
    from llmx.core.train.sft.batch import labelled_nll

    model, proc = _model(tiny_llava(tmp_path / "m"))
    batch = _batch(proc, _convs(2), model)
    last = batch["labels"][0].ne(-100).nonzero()[-1, 0]
    other = {**batch, "input_ids": batch["input_ids"].clone()}
    other["input_ids"][0, last] = (other["input_ids"][0, last] + 5) % 200 + 40
    with torch.no_grad():
        a, b = (model(**x).logits[0, :last] for x in (batch, other))
        leaky = [model(**{k: v for k, v in x.items() if k != "labels"}).logits[0, :last] for x in (batch, other)]
        loss = model(**batch).loss.item()
    assert torch.equal(a, b)  # causal again: the answer's last token reaches no earlier logit
    assert not torch.equal(*leaky)  # without labels the router reads every text token (the inference rule)
    assert labelled_nll(model, [batch]) == pytest.approx(loss, rel=1e-5)


def test_generate_goes_through_the_moe_and_batches_do_not_change_replies(tiny_llava, tmp_path):
    from llmx.core.multimodal.answer import generate

    model, proc = _model(tiny_llava(tmp_path / "m"))
    # generate() precomputes image features (skipping the adapter) only for a forward that takes mm_encoder_outputs
    # (transformers 5.23's test; 5.17 never does): the adapter's does not. Pixels go through the forward each time.
    params = inspect.signature(model.forward).parameters
    assert "mm_encoder_outputs" not in params and model._supports_logits_to_keep()
    convs = _convs(5, {"en": 1, "ar": 1, "zh": 1})  # prompts of several lengths: left padding in a batch
    with torch.no_grad():
        with_moe = generate(model, proc, convs, 17, 6, batch_size=5)
        assert with_moe == [generate(model, proc, [c], 17, 6)[0] for c in convs]
        model.visual_adapter.use_moe = False
        assert generate(model, proc, convs, 17, 6, batch_size=5) != with_moe


def test_a_bfloat16_parrot_model_runs_saves_and_reloads(tiny_llava, tmp_path):
    from llmx.core import models
    from llmx.core.multimodal.answer import generate
    from llmx.core.multimodal.model import load

    model, proc = load(tiny_llava(tmp_path / "m"), torch.bfloat16, "cpu")
    torch.manual_seed(0)
    model = AdaptedLlava.adopt(model, MultilingualMoE(model.config.text_config.hidden_size)).eval()
    assert next(model.visual_adapter.parameters()).dtype == torch.bfloat16
    batch = _batch(proc, _convs(2), model)
    with torch.no_grad():
        logits = model(**batch).logits
        replies = generate(model, proc, _convs(2), 17, 4)
    out = models.save(model, proc, tmp_path / "saved")
    again, _ = load(out, torch.bfloat16, "cpu")
    with torch.no_grad():
        assert torch.equal(again.eval()(**batch).logits, logits)
    assert generate(again, proc, _convs(2), 17, 4) == replies


def test_a_wide_image_is_padded_to_a_square_not_cropped(tiny_llava, tmp_path):
    from PIL import Image

    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import load

    _, proc = load(tiny_llava(tmp_path / "m"), torch.float32, "cpu")
    wide = Image.new("RGB", (64, 32), (255, 0, 0))
    wide.paste(Image.new("RGB", (4, 32), (0, 0, 255)), (60, 0))  # a blue edge a centre crop would lose
    px = pixel_values(proc, [wide])[0]
    assert px.shape == (3, 32, 32)
    mean = torch.tensor(proc.image_processor.image_mean)[:, None]
    assert torch.allclose(px[:, 0, :], px[:, 0, :1].expand(3, 32)) and px[2, 16, 31] > px[0, 16, 31]  # blue kept
    assert torch.allclose(px[:, 0, 5:10], torch.zeros(3, 5) + (torch.round(mean * 255) / 255 - mean) /
                          torch.tensor(proc.image_processor.image_std)[:, None], atol=0.02)  # the mean-colour band


def test_a_saved_processor_gives_plain_transformers_llmx_pixels_for_a_non_square_image(tiny_llava, tmp_path):
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor, CLIPImageProcessorPil

    from llmx.core import models
    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import load

    folder = tiny_llava(tmp_path / "hf")
    hf = AutoProcessor.from_pretrained(folder, local_files_only=True)
    cropping = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    hf.image_processor = cropping  # as llava-hf's LLaVA-1.5 folders ship: resize, then a centre crop
    hf.save_pretrained(folder)
    model, proc = load(folder, torch.float32, "cpu")
    out = models.save(model, proc, tmp_path / "saved")
    saved = AutoProcessor.from_pretrained(out, local_files_only=True)
    rng = np.random.default_rng(0)
    for w, h in ((64, 32), (27, 50)):
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        side = max(w, h)  # LLaVA's expand2square by hand: centred on the mean colour
        square = Image.new("RGB", (side, side), tuple(int(255 * m) for m in cropping.image_mean))
        square.paste(image, ((side - w) // 2, (side - h) // 2))
        ours = pixel_values(proc, [image])
        assert torch.equal(ours, cropping([square], return_tensors="pt")["pixel_values"])
        plain = saved(images=[image], text=["USER: <image>\nHi ASSISTANT:"], return_tensors="pt")["pixel_values"]
        assert torch.equal(plain, ours)  # the saved processor pads as llmx does
        assert not torch.allclose(hf(images=[image], text=["<image>"], return_tensors="pt")["pixel_values"], ours)


def test_mmbench_files_are_scored_by_circular_eval(tmp_path):
    from llmx.errors import UsageError

    rows = _questions(tmp_path / "gen", 3)
    copies = []
    for r in rows[:2]:
        copies.append({**r})
        copies.append({**r, "index": str(int(r["index"]) + 1_000_000), "image": r["index"]})  # a copy of question i
    copies.append({**rows[2], "index": "2000002"})  # a copy whose question is missing: dropped, as VLMEvalKit does
    (tmp_path / "mmb").mkdir()
    for code in ("en", "cn"):  # the same indices in another language are other questions
        _tsv(tmp_path / "mmb" / f"mmbench_dev_{code}.tsv", [list(r.values()) for r in copies], list(copies[0]))
    items = mmmb.read(tmp_path / "mmb")
    plain = _tsv(tmp_path / "mmmb_en.tsv", [list(r.values()) for r in rows], list(rows[0]))
    assert mmmb.circular(tmp_path / "mmb", items) and not mmmb.circular(plain, mmmb.read(plain))
    scores = [1.0, 1.0, 1.0, 0.0, 1.0] + [1.0, 0.0, 1.0, 1.0, 1.0]  # zh (cn sorts first): question 1 wrong once
    questions, graded = mmmb.grouped(items, scores, True)  # en: question 0 wrong once
    assert [(q.language, q.index) for q in questions] == [("zh", "0"), ("zh", "1"), ("en", "0"), ("en", "1")]
    assert graded == [1.0, 0.0, 0.0, 1.0]
    assert mmmb.grouped(items, scores, False) == (items, scores)
    bad = [{**copies[0], "index": "q7"}]
    _tsv(tmp_path / "mmbench_dev_tr.tsv", [list(r.values()) for r in bad], list(bad[0]))
    with pytest.raises(UsageError, match="mmbench_dev_tr.tsv:2: index 'q7' is not an integer"):
        mmmb.grouped(mmmb.read(tmp_path / "mmbench_dev_tr.tsv"), [1.0], True)


def test_held_out_loss_and_reper_log_probs_pass_the_labels_on(tiny_llava, tmp_path):
    from llmx.core.train.sft.batch import labelled_nll
    from llmx.plugins.reper import pack, train

    model, proc = _model(tiny_llava(tmp_path / "m"))
    seen = []
    forward = model.forward
    model.forward = lambda *a, **k: seen.append("labels" in k and k["labels"] is not None) or forward(*a, **k)
    labelled_nll(model, [_batch(proc, _convs(2), model)])
    from llmx.core.multimodal.batch import examples

    items = examples(proc, _convs(2), 17, 512)
    train.sequence_logps(model, items, proc.tokenizer.pad_token_id)
    packed = [pack.Packed(e, pack.runs(e.row.trained), [0], [1.0]) for e in items]
    b = pack.batch(packed, proc.tokenizer.pad_token_id, "cpu", proc.tokenizer.eos_token_id)
    model(**b.inputs)  # RPL's forward: the dialogue's answers are labelled, so the router skips them
    assert seen == [True, True, True]
    assert torch.equal(b.inputs["labels"] != -100, _batch(proc, _convs(2), model)["labels"] != -100)


def test_tsv_quirks_a_bom_a_dangling_image_reference_and_mixed_benchmarks(tmp_path):
    from llmx.errors import UsageError

    mmmb.write(tmp_path / "gen", 2, 0, ["en"])
    text = (tmp_path / "gen" / "mmmb_en.tsv").read_text(encoding="utf-8")
    (tmp_path / "bom").mkdir()
    (tmp_path / "bom" / "mmmb_en.tsv").write_text("\ufeff" + text, encoding="utf-8")
    assert len(mmmb.questions(mmmb.read(tmp_path / "bom"), True)) == 2
    header, first, _ = text.split("\n", 2)
    dangling = first.rsplit("\t", 1)[0] + "\t42"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "mmmb_en.tsv").write_text(f"{header}\n{dangling}\n", encoding="utf-8")
    with pytest.raises(UsageError, match="mmmb_en.tsv:2: image '42' names no row's index"):
        mmmb.read(tmp_path / "bad")
    (tmp_path / "bom" / "mmbench_dev_en.tsv").write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match="several benchmarks"):
        mmmb.read(tmp_path / "bom")
    (tmp_path / "two").mkdir()
    for name in ("MMBench_DEV_EN.tsv", "mmbench_dev_en.tsv"):
        (tmp_path / "two" / name).write_text(text, encoding="utf-8")
    with pytest.raises(UsageError, match="two files of one language"):
        mmmb.read(tmp_path / "two")


def test_mmmb_writes_one_item_per_question_after_circular_eval_averaging_to_its_accuracy(cli, tiny_llava, tmp_path):
    """The items ``llmx compare parrot`` pairs: a question is right only when all its rotated copies are."""
    from pathlib import Path

    from llmx.plugins.parrot.evaluate import question_id

    rows = _questions(tmp_path / "gen", 3)
    copies = [c for r in rows for c in ({**r}, {**r, "index": str(int(r["index"]) + 1_000_000), "image": r["index"]})]
    (tmp_path / "mmb").mkdir()
    _tsv(tmp_path / "mmb" / "mmbench_dev_en.tsv", [list(r.values()) for r in copies], list(copies[0]))
    r = cli("--json", "eval", "--method", "mmmb", "--model", tiny_llava(tmp_path / "m"), "--data", tmp_path / "mmb",
            "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    folder = next(Path(tmp_path / "runs").glob("*/artifacts/0_mmmb"))
    answers = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
    items = [json.loads(x) for x in (folder / "questions.jsonl").read_text().splitlines()]
    assert m["circular"] and len(answers) == m["rows"] == 6 and len(items) == m["questions"] == 3
    by_index = {}
    for a in answers:
        by_index.setdefault(int(a["where"].rsplit(":", 1)[1]) // 2, []).append(a["score"])
    assert [i["accuracy"] for i in items] == [float(all(v)) for v in by_index.values()]
    assert sum(i["accuracy"] for i in items) / 3 == pytest.approx(m["accuracy"])
    ids = [i["item"] for i in items]  # the question (index, language, text, options, image), not its file or line
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 3

    def asked(model, data, out):
        r = cli("--json", "eval", "--method", "mmmb", "--model", model, "--data", data, "-o", tmp_path / out)
        assert r.code == 0, r.err
        folder = next(Path(tmp_path / out).glob("*/artifacts/0_mmmb"))
        return [json.loads(x)["item"] for x in (folder / "questions.jsonl").read_text().splitlines()]

    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "mmbench_dev_en.tsv").write_bytes((tmp_path / "mmb" / "mmbench_dev_en.tsv").read_bytes())
    assert asked(tiny_llava(tmp_path / "other", "llama"), tmp_path / "copy", "other") == ids
    mmmb.write(tmp_path / "gen1", 3, 1, ["en"])  # every rotation asked, one item per question (its unrotated row)
    gen = mmmb.read(tmp_path / "gen1")
    got = asked(tiny_llava(tmp_path / "m"), tmp_path / "gen1", "gen1")
    assert len(gen) > 6 and got == [question_id(gen[g[0]]) for g in mmmb.questions(gen, True)] and len(set(got)) == 3
    assert not set(got) & set(ids)


def test_likelihood_norm_picks_by_log_likelihood_per_byte(cli, tiny_llava, tmp_path):
    """lm-eval's acc_norm: a long option that loses on its summed log-likelihood can win per byte."""
    from pathlib import Path

    from llmx.plugins.parrot import likelihood

    assert likelihood.pick([-6.0, -4.0]) == 1
    assert likelihood.pick(likelihood.per_byte([-6.0, -4.0], ["a long one", "ab"])) == 0  # -0.6 against -2.0
    r = cli("--json", "eval", "--method", "mmmb", "--model", tiny_llava(tmp_path / "m"), "--set", "count=3",
            "--set", 'languages=["en"]', "--set", "scoring=likelihood_norm", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    folder = next(Path(tmp_path / "runs").glob("*/artifacts/0_mmmb"))
    for a in (json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()):
        assert a["picked"] == likelihood.pick(a["per_byte"])


def test_the_parrot_comparison_reports_language_and_routing_per_seed_and_never_voids_on_them(tmp_path):
    """Accuracy by language beside the verdict, and each run's routing figures per seed: reported, not judged (a
    routing accuracy of 0 is a finding, not a seed whose training was skipped)."""
    from llmx.core.compare import runner
    from llmx.core.plugins import host

    spec = host().comparison("parrot")
    assert spec.by == "language" and "routing_language_accuracy" in spec.diagnostics and not spec.counts
    keys = [(f"q{lang}{k}", 0) for lang in ("en", "zh") for k in range(20)]

    def rows(value, diag=None):
        return [{"seed": s, "run_dir": "x", "cost": 300.0, "value": None, "split": None, "machine": None,
                 "items": {key: value(s, k) for k, key in enumerate(keys)},
                 "extra": {"language": {key: key[0][1:3] for key in keys}},
                 **({"diagnostics": diag(s)} if diag else {})} for s in spec.seeds]

    diag = lambda s: {"routing_language_accuracy_init": 0.2, "routing_language_accuracy": 0.0,  # noqa: E731
                      "routing_chance": 1 / 6, "routing_top_expert": "en:3 zh:3"}
    result = runner._judge(runner.Plan(spec, "m", {}, spec.seeds, False, tmp_path), {
        "stage1-only": rows(lambda s, k: 0.25), "llava": rows(lambda s, k: float(k % 2)),
        "parrot": rows(lambda s, k: float(k % 3 == 0), diag)})
    assert not any("void" in v["verdict"] or "void_seeds" in v for v in result["verdicts"])
    md = runner.markdown(result)
    assert "accuracy (language en)" in md and "accuracy (language zh)" in md
    assert "routing_language_accuracy 0.000" in md and "routing_top_expert en:3 zh:3" in md
