"""The multimodal stage: digit scenes, the tiny LLaVA reference model, LLaVA-format data and the llava / scenes-vqa
methods."""

from __future__ import annotations

import json
import random

import pytest
import torch

from llmx.core.multimodal import languages as L
from llmx.core.multimodal import qa, scenes
from llmx.core.multimodal.answer import f1, judge


def test_scenes_are_seeded_and_test_scenes_use_unseen_handwriting():
    a, b = scenes.scenes(40, "train", 3), scenes.scenes(40, "train", 3)
    assert a == b and a != scenes.scenes(40, "train", 4)
    train_images = {o.image for s in scenes.scenes(400, "train", 0) for o in s.objects}
    test_images = {o.image for s in scenes.scenes(400, "test", 0) for o in s.objects}
    assert train_images and test_images and not train_images & test_images
    labels = scenes._digits()[1]
    for s in a:
        digits = [o.digit for o in s.objects]
        assert len(set(digits)) == len(digits) and all(labels[o.image] == o.digit for o in s.objects)
        cells = [L.CELLS.index(o.cell) for o in s.objects]
        assert cells == sorted(set(cells))


def test_relations_follow_from_cells_and_pixels_carry_colour_and_size():
    s = scenes.Scene((scenes.Obj(3, "red", "large", "top_left", 3), scenes.Obj(5, "blue", "small", "top_right", 5),
                      scenes.Obj(7, "green", "small", "bottom_left", 7)), "train")
    assert s.relations == [(3, "left_of", 5), (5, "above", 7)]
    px = s.pixels().astype(int)
    assert px.shape == (32, 32, 3)
    top_left, top_right = px[:16, :16], px[:16, 16:]
    assert top_left[..., 0].sum() > 5 * top_left[..., 2].sum() > 0  # red ink
    assert top_right[..., 2].sum() > top_right[..., 0].sum()  # blue
    assert (top_left.sum(-1) > 0).sum() > 2 * (top_right.sum(-1) > 0).sum()  # large covers more
    assert px[16:, 16:].sum() == 0  # the empty cell stays black


def test_questions_are_answerable_from_the_truth_in_every_language():
    rng = random.Random(0)
    for s in scenes.scenes(30, "test", 1):
        for lang in L.LANGUAGES:
            op = qa.question(s, rng, lang, "open")
            assert L.parse_answer(lang, op.kind, op.answer) == op.value
            ch = qa.question(s, rng, lang, "choice")
            assert ch.options[ord(ch.answer) - ord("A")] == L.answer(lang, ch.kind, ch.value)
            assert ch.question.endswith(L.TABLES[lang]["mc_instruction"])
            cap = qa.question(s, rng, lang, "caption")
            assert L.parse_caption(lang, cap.answer) == s.truth()
        if len(s.objects) > 1:  # a false relation is false of the cells (a diagonal pair is above and left of)
            for _ in range(10):
                slots, value = qa.ask(s, rng, "relation")
                assert qa._holds(s, slots["a"], slots["relation"], slots["b"]) == value


def test_replies_are_parsed_as_mmmb_and_per_language():
    from llmx.core.multimodal.answer import choice

    opts = ["red", "blue", "green", "white"]
    assert [choice(r, opts) for r in ("C", "(B)", "B. blue", "The answer is D.", "Correct answer: A", "green")] == \
        [2, 1, 1, 3, 0, 2]
    assert choice("Azul", opts) is None and choice("A resposta é B.", opts) is None and choice("", opts) is None
    assert choice("Büyük", ["büyük", "küçük"]) == 0 and choice("Dört", ["dört", "bir", "iki"]) == 0
    assert choice("C", ["small", "large"]) is None  # a letter past the options is wrong, not a crash
    assert L.parse_answer("zh", "relation", "不是") is False and L.parse_answer("zh", "relation", "是") is True
    assert L.parse_answer("zh", "digit_at", "右上角有一个数字七") == 7 and L.parse_answer("zh", "count", "一个") == 1
    assert L.parse_answer("tr", "digit_at", "bir yedi rakamı") == 7 and L.parse_answer("tr", "count", "bir") == 1
    assert L.parse_answer("pt", "digit_at", "um sete") == 7 and L.parse_answer("en", "colour", "Red.") == "red"


def test_text_documents_use_the_chat_template_and_any_tokenizer_is_asked_in_it():
    from llmx.core.multimodal import model as M
    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    M.add_image_token(tok)
    msgs = [{"role": "user", "content": "<image>\nWhat?"}, {"role": "assistant", "content": "red"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == M.user_turn(msgs[0]["content"]) + M.assistant_turn("red")
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    assert tok.apply_chat_template(parts, tokenize=False, add_generation_prompt=True) == "USER: <image>\nWhat? ASSISTANT:"
    other = byte_tokenizer()
    other.chat_template = "{{ 'a llava-hf template' }}"
    assert M.text_tokenizer(other).chat_template == M.CHAT_TEMPLATE and other.chat_template != M.CHAT_TEMPLATE


def test_judge_scores_letters_words_and_caption_f1():
    convs = qa.conversations(30, "test", 0, {"en": 1, "ru": 1}, {"open": 1, "choice": 1, "caption": 1})
    for c in convs:
        right = c.messages[1]["content"]
        assert judge(c, right) == 1.0
        if c.meta["format"] == "choice":
            wrong = next(x for x in "ABCD"[:len(c.meta["options"])] if x != right)
            assert judge(c, f"{wrong}.") == 0.0
    truth = [("object", "3"), ("attribute", "3", "colour", "red")]
    assert f1(truth, truth) == 1.0 and f1([], truth) == 0.0
    assert f1([("object", "3"), ("object", "9")], truth) == pytest.approx(0.5)


@pytest.fixture
def llava_test():
    from llmx.core import zoo

    return zoo.locate("ref:llava-test")


def test_ref_llava_loads_offline_as_plain_transformers(llava_test):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(llava_test, local_files_only=True).eval()
    proc = AutoProcessor.from_pretrained(llava_test, local_files_only=True)
    info = json.loads((llava_test / "zoo.json").read_text())
    assert set(info["text_qa_accuracy"]["open"]) == set(L.LANGUAGES)
    assert set(info["probe_accuracy"]) == {"digit", "colour", "cell"}
    assert info["stage1_caption_loss"] < info["stage1_caption_loss_before"]
    assert model.config.vision_feature_layer == -2 and model.config.vision_feature_select_strategy == "full"
    img = scenes.scenes(1, "test", 0)[0].image()
    batch = proc(images=[img], text=["USER: <image>\nDescribe the image. ASSISTANT:"], return_tensors="pt")
    assert int((batch["input_ids"] == model.config.image_token_id).sum()) == 65  # 64 patches + CLS
    from llmx.core.multimodal.model import embed

    with torch.no_grad():
        pixel_path = model(**batch).logits
        embeds = embed(model, batch["input_ids"], batch["pixel_values"])
        scattered = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).logits
    assert torch.equal(pixel_path, scattered)


def test_ref_llava_tokenizer_round_trips_and_covers_every_script(llava_test):
    from transformers import AutoProcessor

    tok = AutoProcessor.from_pretrained(llava_test, local_files_only=True).tokenizer
    rng = random.Random(0)
    lengths = {lang: 0 for lang in L.LANGUAGES}
    for s in scenes.scenes(20, "test", 2):
        for lang in L.LANGUAGES:
            for fmt in ("open", "choice", "caption"):
                q = qa.question(s, random.Random(rng.random()), lang, fmt)
                for text in (q.question, q.answer):
                    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
                lengths[lang] += len(tok(q.question, add_special_tokens=False)["input_ids"])
    assert all(n <= 2 * lengths["en"] for n in lengths.values()), lengths


def test_same_seed_same_llava_weights(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from llmx.core import zoo

    folders = []
    for k in range(2):
        monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / f"c{k}"))
        folders.append(zoo.ensure(zoo.RefRequest("llava", "test"), show_progress=False))
    a, b = (load_file(f / "model.safetensors") for f in folders)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_llava_hf_folder_trains_and_evaluates(cli, tmp_path, tiny_llava):
    model = tiny_llava(tmp_path / "tiny-llava")
    r = cli("--json", "train", "--method", "llava", "--model", model, "--set", "steps=3", "--set", "batch_size=2",
            "--set", "eval_rows=4", "--set", "scenes={\"count\": 8}", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    out = r.json()["stages"][0]["metrics"]
    assert out["image_tokens"] == 17 and out["train_rows"] == 8 and out["stage"] == 2
    r = cli("--json", "eval", "--method", "scenes-vqa", "--model", model, "--set", "count=3", "--set",
            "languages=[\"en\", \"ar\"]", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    metrics = r.json()["stages"][0]["metrics"]
    assert metrics["questions"] == 6 and {"accuracy_en", "accuracy_ar", "accuracy_non_english"} <= set(metrics)
    answers = tmp_path / "runs" / r.json()["run_dir"] / "artifacts" / "0_scenes-vqa" / "answers.jsonl"
    items = [json.loads(x) for x in answers.read_text().splitlines()]  # the items llmx compare llava pairs
    assert all(i["accuracy"] == i["score"] for i in items)
    assert sum(i["accuracy"] for i in items) / 6 == pytest.approx(metrics["accuracy"])
    ids = [i["item"] for i in items]  # the scene, language, question and answer: one per question and language
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 6

    def asked(model, *sets):
        r = cli("--json", "eval", "--method", "scenes-vqa", "--model", model, *[a for s in sets for a in ("--set", s)],
                "-o", tmp_path / "again")
        assert r.code == 0, r.err
        path = tmp_path / "again" / r.json()["run_dir"] / "artifacts" / "0_scenes-vqa" / "answers.jsonl"
        return [json.loads(x)["item"] for x in path.read_text().splitlines()]

    other = tiny_llava(tmp_path / "other", "llama")
    assert asked(other, "count=2", "languages=[\"ar\"]") == ids[3:5]  # another model, the same questions
    assert not set(asked(other, "count=2", "languages=[\"ar\"]", "format=open")) & set(ids)  # other questions


def test_stage_1_trains_the_projector_only_and_stage_2_never_the_tower(tmp_path, tiny_llava):
    from transformers import LlavaForConditionalGeneration

    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.multimodal.model import load
    from llmx.core.train.loop import TrainConfig, train

    folder = tiny_llava(tmp_path / "m", "llama")
    convs = qa.conversations(16, "train", 0, {"en": 1}, {"open": 1})
    for stage in (1, 2):
        model, proc = load(folder, torch.float32, "cpu")
        start = {k: v.clone() for k, v in model.state_dict().items()}
        items = examples(proc, convs, 17, 128)
        pad = proc.tokenizer.pad_token_id
        before = T.heldout_loss(model, items, pad)
        train(model, T.trainable(model, stage), T.loss_fn(model, items, 4, 0, pad),
              TrainConfig(steps=25, lr=3e-3, warmup=0), weight=T.weights(items, 4, 0))
        assert T.heldout_loss(model, items, pad) < before
        changed = {k for k, v in model.state_dict().items() if not torch.equal(v, start[k])}
        assert changed and not any(T.TOWER in k for k in changed)
        if stage == 1:
            assert all(T.PROJECTOR in k for k in changed)
        else:
            assert any("language_model" in k for k in changed) and any(T.PROJECTOR in k for k in changed)
    assert isinstance(model, LlavaForConditionalGeneration)


@pytest.mark.parametrize("stage", [1, 2])
def test_a_bfloat16_llava_trains_with_its_tower_frozen_in_bfloat16(cli, tmp_path, stage, tiny_llava):
    model = tiny_llava(tmp_path / "m")
    r = cli("--json", "train", "--method", "llava", "--model", model, "--dtype", "bfloat16", "--set", f"stage={stage}",
            "--set", "steps=2", "--set", "batch_size=2", "--set", "eval_rows=2", "--set", "scenes={\"count\": 4}",
            "--set", "save=false", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    assert r.json()["stages"][0]["metrics"]["heldout_loss"] > 0


def test_projector_lr_is_its_own_param_group():
    from llmx.core.multimodal.train import lr_scale
    from llmx.core.train.loop import TrainConfig, train

    net = torch.nn.ModuleDict({"multi_modal_projector": torch.nn.Linear(2, 2), "lm": torch.nn.Linear(2, 2)})
    seen = []
    x = torch.ones(1, 2)
    train(net, dict(net.named_parameters()), lambda i: (net["multi_modal_projector"](x) + net["lm"](x)).sum(),
          TrainConfig(steps=2, lr=1e-3, warmup=0, schedule="constant"),
          after_step=lambda s: seen.append(sorted(g["lr"] for g in s.optimizer.param_groups)),
          lr_scale=lr_scale(1e-3, 5e-3))
    assert seen[-1] == pytest.approx([1e-3, 5e-3])


def test_bad_conversation_files_are_one_line_errors_naming_the_row(cli, tmp_path, tiny_llava):
    model = tiny_llava(tmp_path / "m")
    img = tmp_path / "a.png"
    scenes.scenes(1, "train", 0)[0].image().save(img)
    good = {"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                                {"from": "gpt", "value": "a digit"}]}
    missing = {**good, "image": "gone.png"}
    twice = {**good, "conversations": [{"from": "human", "value": "<image>\n<image>\nWhat?"},
                                       {"from": "gpt", "value": "x"}]}
    none = {**good, "conversations": [{"from": "human", "value": "What?"}, {"from": "gpt", "value": "x"}]}
    for bad, phrase in ((missing, "image file not found"), (twice, "2 <image> placeholders"),
                        (none, "0 <image> placeholders")):
        f = tmp_path / "rows.jsonl"
        f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        runs = tmp_path / "runs"
        r = cli("train", "--method", "llava", "--model", model, "--data", f, "--set", "steps=1", "-o", runs)
        assert r.code == 2, r.err
        message = r.err.strip().splitlines()
        assert len(message) <= 2 and f"{f}:2:" in message[0] and phrase in message[0], r.err
        assert not list(runs.glob("*/artifacts/*/*"))
    broken = tmp_path / "broken.png"
    broken.write_bytes(img.read_bytes()[:60])  # a PNG header and no image data
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "image": "broken.png"}) + "\n")
    r = cli("train", "--method", "llava", "--model", model, "--data", f, "--set", "steps=1", "-o", runs)
    assert r.code == 2 and f"{f}:2: cannot read image" in r.err.strip().splitlines()[0], r.err
    array = tmp_path / "rows.json"
    array.write_text("[\n" + json.dumps(good) + ",\n" + json.dumps(missing) + "\n]\n")
    from llmx.core.multimodal.conversations import load
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match=rf"{array}:3: image file not found"):
        load(array)
    array.write_text("[\n" + json.dumps(good) + "\n]\n")
    assert len(load(array)) == 1 and load(array)[0].pil().size == (32, 32)


def test_replies_do_not_depend_on_the_batch_and_long_prompts_are_refused(llava_test):
    from llmx.core.eval.generate import generate as complete
    from llmx.core.multimodal.answer import generate
    from llmx.core.multimodal.model import image_tokens, load
    from llmx.errors import UsageError

    model, proc = load(llava_test, torch.float32, "cpu")
    convs = qa.conversations(6, "test", 3, {"en": 1, "ar": 1}, {"open": 1, "caption": 1})  # prompts of several lengths
    n = image_tokens(model)
    assert generate(model, proc, convs, n, 6, batch_size=4) == [generate(model, proc, [c], n, 6)[0] for c in convs]
    with pytest.raises(UsageError, match="over this model's context"):
        complete(model, proc.tokenizer, ["x " * 2000], max_new_tokens=4, truncate=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_kept_stage_is_loaded_not_trained_and_the_next_stage_sees_the_same_model(tmp_path, monkeypatch, dtype,
                                                                                    tiny_llava):
    """``keep``: the second run with the same model, stages, params and seed loads the weights (as trained, float32
    masters of a bfloat16 model included) and the evaluation after it answers exactly as after training; another
    seed trains; keep with save is refused."""
    from llmx import api
    from llmx.core import stagecache
    from llmx.core.context import RunContext
    from llmx.core.multimodal.params import LlavaTrainParams
    from llmx.errors import RunFailed

    monkeypatch.setattr(stagecache, "_where", lambda kind, digest: tmp_path / "stages" / kind / digest)
    model = str(tiny_llava(tmp_path / "m"))
    train = {"method": "llava", "params": {"steps": 3, "batch_size": 2, "eval_rows": 0, "save": False, "keep": True,
                                           "lr": 1e-2, "scenes": {"count": 8}}}
    ask = {"method": "scenes-vqa", "params": {"count": 4, "languages": ["en"]}}
    handed = []  # each model a stage handed on: its tensors
    real = RunContext.set_model

    def spy(self, m, tokenizer=None):
        handed.append({k: v.detach().clone() for k, v in m.state_dict().items()})
        return real(self, m, tokenizer)

    monkeypatch.setattr(RunContext, "set_model", spy)

    def run(seed, out):
        result = api.run({"model": model, "threads": 1, "seed": seed, "dtype": dtype, "pipeline": [train, ask]},
                         output_dir=tmp_path / out)
        answers = tmp_path / out / result["run_dir"] / "artifacts" / "1_scenes-vqa" / "answers.jsonl"
        return [s["metrics"] for s in result["stages"]], [json.loads(x)["reply"] for x in
                                                          answers.read_text().splitlines()]

    first, asked = run(0, "a")
    as_trained = handed[-1]
    from llmx.core.multimodal import stage as S

    monkeypatch.setattr(S, "run", lambda *a: (_ for _ in ()).throw(AssertionError("trained again")))
    second, again = run(0, "b")
    assert again == asked and {**second[0], "kept": False} == first[0] and first[0]["steps"] == 3
    assert second[0]["kept"] and not first[0]["kept"]
    assert handed[-1].keys() == as_trained.keys()
    assert all(handed[-1][k].dtype == v.dtype and torch.equal(handed[-1][k], v) for k, v in as_trained.items())
    assert dtype == "float32" or torch.float32 in {v.dtype for v in as_trained.values()}
    with pytest.raises(RunFailed, match="trained again"):  # another seed: another entry, so trained
        run(1, "c")
    train["params"]["steps"] = 2
    with pytest.raises(RunFailed, match="trained again"):  # another param: trained
        run(0, "d")
    with pytest.raises(ValueError, match="save: false"):
        LlavaTrainParams(keep=True)
