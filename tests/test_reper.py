"""RePer: the reflective unlikelihood loss, the rule critic, the dialogue data and builder, packing, the align
objectives and the policy/critic loop."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from llmx.core.multimodal import languages as L
from llmx.core.multimodal.scenes import Obj, Scene, scenes
from llmx.errors import UsageError
from llmx.plugins.reper import critic as C
from llmx.plugins.reper.build import QUESTION, corrupt
from llmx.plugins.reper.dialogues import Dialogue, assemble, load
from llmx.plugins.reper.loss import reflective_unlikelihood

SCENE = Scene((Obj(3, "red", "large", "top_left", 3), Obj(5, "blue", "small", "top_right", 5),
               Obj(7, "green", "small", "bottom_left", 7)), "train")


@pytest.fixture(scope="module")
def llava():
    from llmx.core import zoo
    from llmx.core.multimodal.model import load as load_llava

    return load_llava(zoo.locate("ref:llava-test"), torch.float32, "cpu")


def _caption(objects, relations) -> str:
    return L.caption("en", objects, relations)


def _dialogue(scene: Scene, answers: list[str], where: str = "d") -> Dialogue:
    critic = C.RuleCritic()
    scores = [critic.score(scene, "Describe the image.", a) for a in answers]
    return Dialogue(where, scene, QUESTION, answers, [f for _, f in scores[:-1]], list(range(1, len(answers) + 1)),
                    [s for s, _ in scores], [None] * len(answers))


# the loss ----------------------------------------------------------------------------------------------------------

def _toy(turns: int = 3, length: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(2, length, generator=g) * 3
    masks = torch.zeros(2, turns, length)
    for b in range(2):
        for t in range(turns):
            masks[b, t, 1 + 4 * t:3 + 4 * t + b] = 1
    return lp, masks


def test_alpha_zero_is_sigma_weighted_sft_and_sigma_one_is_the_nll():
    lp, masks = _toy()
    sigma = torch.tensor([[1 / 3, 2 / 3, 1.0], [0.2, 0.5, 0.9]])
    loss, _ = reflective_unlikelihood(lp, masks, sigma, alpha=0.0)
    means = (masks * lp[:, None]).sum(-1) / masks.sum(-1)
    assert torch.allclose(loss, -(sigma * means).sum(-1))
    total, _ = reflective_unlikelihood(lp, masks, torch.ones(2, 3), alpha=8.0, reduction="sum")
    assert torch.allclose(total, -(masks.sum(1) * lp).sum(-1))  # sigma = 1: the unlikelihood weight is 0


def test_unlikelihood_is_finite_as_p_goes_to_one_and_grads_stay_on_the_responses():
    lp = torch.tensor([[-3.0, 0.0, -1e-12, -1e-7, -2.0, -0.5]], requires_grad=True)
    masks = torch.tensor([[[0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1.0]]])
    for granularity in ("token", "sequence"):
        loss, _ = reflective_unlikelihood(lp, masks, torch.tensor([[0.0, 0.5]]), 8.0, 1e-6, granularity)
        (grad,) = torch.autograd.grad(loss.sum(), lp)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
        assert grad[0, 0] == 0 and grad[0, 4] == 0  # question / feedback positions carry no loss
        assert grad[0, 5] != 0
    assert loss.item() < 8 * -math.log(1e-6) + 10


def test_sequence_unlikelihood_vanishes_for_captions_of_more_than_a_few_tokens():
    lp = torch.full((1, 30), -0.7)
    masks = torch.zeros(1, 1, 30)
    masks[0, 0, 5:25] = 1
    _, seq = reflective_unlikelihood(lp, masks, torch.zeros(1, 1), granularity="sequence")
    _, tok = reflective_unlikelihood(lp, masks, torch.zeros(1, 1), granularity="token")
    assert abs(seq["unlikelihood"].item()) < 1e-5 < abs(tok["unlikelihood"].item()) > 0.5


def test_a_step_on_a_sigma_zero_turn_lowers_its_probability():
    logits = torch.zeros(1, 6, 5, requires_grad=True)
    ids = torch.tensor([[0, 1, 2, 3, 4, 0]])
    masks = torch.zeros(1, 1, 5)
    masks[0, 0, 1:4] = 1

    def turn_logp(x):
        from llmx.core.preference import token_logps

        return (token_logps(x, ids) * masks[0]).sum()

    before = turn_logp(logits).item()
    from llmx.core.preference import token_logps

    loss, _ = reflective_unlikelihood(token_logps(logits, ids), masks, torch.zeros(1, 1))
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert turn_logp(logits - 0.5 * grad).item() < before


def test_sigma_one_equals_the_llava_trainers_response_nll(llava):
    from llmx.core.multimodal.batch import collate
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.preference import token_logps
    from llmx.plugins.reper.pack import batch, pack

    model, proc = llava
    n = image_tokens(model)
    d = _dialogue(SCENE, ["There is one digit. A small red two is at the top left.", _caption(
        [o.key() for o in SCENE.objects], SCENE.relations)])
    single = _dialogue(SCENE, ["There are two digits."])
    for dia, reduction in ((d, "sum"), (single, "mean")):
        packed = pack(proc, dia, n, 1024, "linear")
        with torch.no_grad():
            hf = model(**collate([packed.example], proc.tokenizer.pad_token_id, "cpu")).loss
            b = batch([packed], proc.tokenizer.pad_token_id, "cpu")
            lp = token_logps(model(**b.inputs).logits, b.inputs["input_ids"])
        loss, _ = reflective_unlikelihood(lp, b.turn_masks, torch.ones_like(b.sigma), 8.0, reduction=reduction)
        tokens = sum(packed.example.row.trained) if reduction == "sum" else 1
        assert loss.item() / tokens == pytest.approx(hf.item(), rel=1e-5)


def test_a_packed_dialogue_scores_each_turn_as_its_own_context_does(llava):
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.preference import token_logps
    from llmx.plugins.reper.pack import batch, pack

    model, proc = llava
    n = image_tokens(model)
    answers = ["There are two digits. A large red three is at the top left.", "There is one digit.",
               _caption([o.key() for o in SCENE.objects], SCENE.relations)]
    d = _dialogue(SCENE, answers)
    pad = proc.tokenizer.pad_token_id

    def per_turn(dialogue):
        b = batch([pack(proc, dialogue, n, 1024, "linear")], pad, "cpu")
        with torch.no_grad():
            lp = token_logps(model(**b.inputs).logits, b.inputs["input_ids"])
        return (b.turn_masks * lp[:, None]).sum(-1)[0]

    whole = per_turn(d)
    assert len(whole) == 3
    for t in range(3):  # the dialogue cut after answer t, scored alone: its last answer
        alone = Dialogue("d", SCENE, QUESTION, answers[:t + 1], d.feedback[:t], d.turns[:t + 1], d.scores[:t + 1],
                         d.sigmas[:t + 1])
        assert per_turn(alone)[-1].item() == pytest.approx(whole[t].item(), abs=1e-4)


def test_packed_dialogues_hold_the_feedback_and_unlikelihood_masks_skip_eos_and_shared_tokens(llava):
    from llmx.core.multimodal.model import image_tokens
    from llmx.plugins.reper.pack import batch, pack

    model, proc = llava
    tok = proc.tokenizer
    d = _dialogue(SCENE, ["There is one digit. A small red two is at the top left.", "There are three digits."])
    packed = pack(proc, d, image_tokens(model), 1024, "linear")
    text = tok.decode(packed.example.row.ids)
    assert d.feedback[0] in text and text.index(d.answers[0]) < text.index(d.feedback[0]) < text.index(d.answers[1])
    for differing in (False, True):
        b = batch([packed], tok.pad_token_id, "cpu", tok.eos_token_id, differing)
        ids = packed.example.row.ids
        (a, e) = packed.spans[0]
        ul = b.ul_masks[0, 0, a - 1:e - 1].tolist()
        assert ids[e - 1] == tok.eos_token_id and ul[-1] == 0 and b.turn_masks[0, 0, e - 2] == 1
        best = set(ids[slice(*packed.spans[-1])])
        expected = [float(x != tok.eos_token_id and (not differing or x not in best)) for x in ids[a:e]]
        assert ul == expected and (sum(expected) < len(expected) - 1 if differing else True)


def test_a_long_dialogue_loses_its_earliest_answers_never_the_image_or_the_last(llava):
    from llmx.core.multimodal.model import IMAGE_TOKEN, image_tokens
    from llmx.plugins.reper.pack import pack

    model, proc = llava
    n = image_tokens(model)
    answers = ["A small red two is at the top left. " * 4, "A small red four is at the top left. " * 4,
               "There are three digits."]
    d = _dialogue(SCENE, answers)
    full = pack(proc, d, n, 4096, "linear")
    cut = pack(proc, d, n, len(full.example.row.ids) - 5, "linear")
    image_id = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert full.kept == [0, 1, 2] and cut.kept[-1] == 2 and cut.kept[0] > 0
    assert cut.example.row.ids.count(image_id) == n
    assert cut.sigma == [(k + 1) / 3 for k in cut.kept]  # each answer keeps its own turn's sigma
    text = proc.tokenizer.decode(cut.example.row.ids)
    assert d.feedback[0] != d.feedback[1] and d.feedback[cut.kept[0]] in text
    assert cut.kept[0] == 0 or d.feedback[cut.kept[0] - 1] not in text


# the critic --------------------------------------------------------------------------------------------------------

def test_a_true_caption_scores_ten_and_each_injected_error_is_named():
    critic = C.RuleCritic()
    objects = [o.key() for o in SCENE.objects]
    true = _caption(objects, SCENE.relations)
    assert critic.score(SCENE, "Describe the image.", true) == (10, C.feedback(10))
    wrong = [(3, "blue", "large", "top_left"), (9, "white", "small", "bottom_right")]  # colour wrong, 9 invented, 5 and 7 missed
    said = _caption(wrong, [(3, "above", 9)])
    score, text = critic.score(SCENE, "Describe the image.", said)
    assert "The three is red, not blue." in text and "mentions a nine that is not in the image" in text
    assert "misses the small blue five at the top right" in text and "misses the small green seven" in text
    assert score == max(1, 10 - (3 + 4 + 2 + 2))
    moved = _caption([objects[0], objects[1], (7, "green", "small", "bottom_right")], [(3, "left_of", 5), (7, "above", 5)])
    score, text = critic.score(SCENE, "q", moved)
    assert "The seven is at the bottom left, not the bottom right." in text
    assert "The seven is not above the five." in text and "does not say that the five is above the seven" in text
    assert score == 10 - 3 - 1 - 1
    assert C.RuleCritic(feedback="score").score(SCENE, "q", said)[1] == C.feedback(score=1)
    assert critic.score(SCENE, "q", "evet")[0] == 1
    twice = _caption([(3, "blue", "large", "top_left"), *objects], SCENE.relations)  # a wrong, then the true, three
    assert critic.score(SCENE, "q", twice) == (7, C.feedback(7, "The three is red, not blue."))


def test_captions_that_name_no_true_object_or_describe_nothing_score_low():
    critic = C.RuleCritic()
    assert critic.score(SCENE, "q", "The five is above the one.")[0] == 1  # relations alone name no object
    score, text = critic.score(SCENE, "q", "There. одна digits. A large red three is at the top left. The three is "
                                           "above the one.")
    assert "mentions a one that is not in the image" in text and '"There" describes nothing' in text
    assert '"одна digits" describes nothing' in text and score == 1  # 10 - 4 - 1 - 1 - 2 - 2, floored


def test_a_noisy_critic_omits_or_misreports_errors_reproducibly():
    caps = [corrupt(SCENE, 3, random.Random(k)) for k in range(40)]
    clean = [C.RuleCritic().judge(SCENE, c) for c in caps]
    noisy = C.RuleCritic(noise=0.6, seed=1)
    judged = [noisy.judge(SCENE, c) for c in caps]
    assert judged == [noisy.judge(SCENE, c) for c in caps]
    assert sum(len(e) for _, e in judged) < sum(len(e) for _, e in clean)  # some omitted
    assert any(e not in set(ce) for (_, es), (_, ce) in zip(judged, clean, strict=True) for e in es)  # misreported
    assert sum(s for s, _ in judged) > sum(s for s, _ in clean)  # a lenient critic
    found = [C.Error(k, f"{k} {i}", a) for i in range(400) for k, a in (("hallucination", ()), ("relation", ()),
                                                                         ("attribute", ("3", "colour", "blue")))]
    rng = random.Random(0)
    kept = [C._misreport(e, C._objects(SCENE.truth()), rng) for e in found]
    assert all(k.kind == e.kind and k.text != e.text for k, e in zip(kept, found, strict=True))
    said = L.parse_caption("en", _caption([(3, "blue", "large", "top_left"), (9, "red", "small", "top_right")], []))
    errs = C.errors(said, SCENE.truth())
    draws = [C.errors(said, SCENE.truth(), (), random.Random(k), 0.5) for k in range(600)]
    share_kept = sum(e in set(errs) for d in draws for e in d) / (len(errs) * len(draws))
    share_named = sum(len(d) for d in draws) / (len(errs) * len(draws))
    assert share_kept == pytest.approx(0.5, abs=0.05) and share_named == pytest.approx(0.75, abs=0.05)


def _names() -> set[str]:
    """Every word or phrase that names an object or what it looks like: digits, colours, sizes, places, relations."""
    t = L.TABLES["en"]
    return {*t["digits"], *t["colours"].values(), *t["sizes"].values(), *t["relations"].values(),
            *t["cells"].values(), *(w for c in t["cells"].values() for w in c.split())}


def scene_names(scene) -> list[str]:
    return [L.TABLES["en"]["digits"][o.digit] for o in scene.objects]


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_kind_feedback_names_no_object_and_scores_as_the_verbatim_critic(noise):
    import re

    names = _names()
    verbatim, kind = C.RuleCritic(noise=noise, seed=3), C.RuleCritic(feedback="kind", noise=noise, seed=3)
    named, kinds_seen = 0, set()
    for i, scene in enumerate(scenes(40, "train", 7)):
        rng = random.Random(i)
        for k in range(6):
            caption = corrupt(scene, k, rng)
            (sv, fv), (sk, fk) = verbatim.score(scene, "q", caption), kind.score(scene, "q", caption)
            assert sv == sk and fk.startswith(C.feedback(sk).removesuffix(C.ASK).strip()) and fk.endswith(C.ASK)
            said = fk.removesuffix(C.ASK)  # the paper's closing "a better one?": no digit meant
            assert not [w for w in names if re.search(rf"\b{w}\b", said, re.IGNORECASE)], (caption, fk)
            kinds_seen |= {x for x, text in C.KIND_TEXT.items() if text in fk}
            named += any(re.search(rf"\b{w}\b", fv.removesuffix(C.ASK)) for w in scene_names(scene))
    assert named > 100  # today's feedback names the scene's objects: the answer is in it
    assert {"hallucination", "miss", "colour", "cell"} <= kinds_seen


def test_kind_feedback_says_each_kind_once_and_takes_the_rule_critic():
    from pydantic import ValidationError

    from llmx.plugins.reper.config import TurnsParams

    wrong = [(3, "blue", "small", "top_left"), (9, "white", "small", "bottom_right")]  # colour, size, 9 invented, 5, 7 missed
    score, text = C.RuleCritic(feedback="kind").score(SCENE, "q", _caption(wrong, []))
    assert text == C.feedback(score, "The caption mentions an object that is not in the image. A colour is wrong. "
                                     "A size is wrong. An object is missing.")
    assert C.RuleCritic(feedback="kind").score(SCENE, "q", "evet") == (1, C.feedback(1, "A sentence describes nothing "
                                                                                   "in the image. An object is "
                                                                                   "missing."))  # 3 misses, said once
    with pytest.raises(ValidationError, match="rule critic"):
        TurnsParams(critic="model", critic_model="ref:llava", feedback="kind")


def test_caption_metrics_and_the_final_answer():
    from llmx.plugins.reper.turns import Turn, caption_metrics, final

    relation_only = caption_metrics(SCENE, _caption([o.key() for o in SCENE.objects], [(9, "above", 7)]))
    assert relation_only["mentioned"] == 4 and relation_only["hallucinated"] == 1
    m = caption_metrics(SCENE, _caption([(3, "red", "large", "top_left"), (9, "red", "small", "top_right")], []))
    # said: object 3 + 3 right attributes, object 9 + 3 attributes; truth: 3 objects x 4 tuples + 2 relations = 14
    assert m["precision"] == pytest.approx(4 / 8) and m["recall"] == pytest.approx(4 / 14)
    assert m["mentioned"] == 2 and m["hallucinated"] == 1 and m["rubric"] == 10 - 4 - 2 - 2
    turns = [Turn("a", 3, ""), Turn("b", 9, ""), Turn("c", 5, "")]
    assert final(turns, "last").answer == "c" and final(turns, "best").answer == "b"


def test_sigma_schedules_and_absent_turns():
    from llmx.plugins.reper.loss import linear_sigma, score_sigma

    assert linear_sigma([1, 2, 3], 3) == [1 / 3, 2 / 3, 1.0] and score_sigma([1, 5.5, 10]) == [0.0, 0.5, 1.0]
    lp, masks = _toy(turns=2)
    padded = torch.cat([masks, torch.zeros(2, 1, masks.shape[-1])], 1)  # a third, absent turn with sigma 0
    for g in ("token", "sequence"):
        a, _ = reflective_unlikelihood(lp, masks, torch.tensor([[0.5, 1.0]] * 2), granularity=g)
        b, _ = reflective_unlikelihood(lp, padded, torch.tensor([[0.5, 1.0, 0.0]] * 2), granularity=g)
        assert torch.allclose(a, b)


# dialogues ---------------------------------------------------------------------------------------------------------

def test_assemble_keeps_wide_gaps_and_orders_worst_to_best():
    cands = [("a", 2, "fa"), ("b", 9, "fb"), ("c", 5, "fc"), ("d", 7, "fd"), ("b", 9, "fb")]
    three = assemble(cands, random.Random(0), 4, 6, 3, [0, 0, 1])
    assert [c[0] for c in three] == ["a", "c", "b"]  # 5 is nearer the midpoint 5.5 than 7
    assert [c[0] for c in assemble(cands, random.Random(0), 4, 6, 3, [0, 1, 0])] == ["a", "b"]
    assert [c[0] for c in assemble(cands, random.Random(0), 4, 6, 3, [1, 0, 0])] == ["b"]
    assert assemble(cands, random.Random(0), 8, 6, 3) is None  # gap 7 < 8
    assert assemble(cands, random.Random(0), 4, 10, 3) is None  # best 9 < 10
    assert [c[0] for c in assemble([("a", 2, ""), ("b", 9, "")], random.Random(0), 4, 6, 3, [0, 0, 1])] == ["a", "b"]


def test_corruption_makes_the_errors_the_critic_reads():
    rng = random.Random(0)
    assert corrupt(SCENE, 0, rng) == _caption([o.key() for o in SCENE.objects], SCENE.relations)
    scores = [sum(C.RuleCritic().judge(SCENE, corrupt(SCENE, k, rng))[0] for _ in range(20)) / 20 for k in range(5)]
    assert scores[0] == 10 and scores == sorted(scores, reverse=True) and scores[-1] < 5


def _write_rows(tmp_path, rows):
    SCENE.image().save(tmp_path / "a.png")
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


GOOD = {"image": "a.png", "conversations": [
    {"from": "human", "value": "<image>\nDescribe the image."},
    {"from": "gpt", "value": "There is one digit.", "turn": 1, "score": 2},
    {"from": "human", "value": "This caption can only get the score 2. Could you generate a better one?"},
    {"from": "gpt", "value": "There are three digits.", "turn": 2, "score": 5, "sigma": 1.0}]}


def test_dialogue_rows_round_trip(tmp_path):
    d = load(_write_rows(tmp_path, [GOOD]))[0]
    assert d.answers == ["There is one digit.", "There are three digits."] and d.scores == [2, 5]
    assert d.sigmas == [None, 1.0] and d.row("a.png") == GOOD


def test_bad_dialogue_rows_are_one_line_errors_and_nothing_is_written(cli, tmp_path):
    from llmx.core import zoo

    turns = GOOD["conversations"]
    swapped = {**GOOD, "conversations": [turns[0], {**turns[1], "turn": 2}, turns[2], {**turns[3], "turn": 1}]}
    roles = {**GOOD, "conversations": [turns[0], turns[1], turns[3], turns[2]]}
    sigma = {**GOOD, "conversations": [turns[0], turns[1], turns[2], {**turns[3], "sigma": 1.5}]}
    missing = {**GOOD, "image": "gone.png"}
    no_image = {"conversations": GOOD["conversations"]}
    model = zoo.locate("ref:llava-test")
    for bad, phrase in ((swapped, "turns out of order"), (roles, "turns out of order"),
                        (sigma, "sigma 1.5 is outside [0, 1]"), (missing, "image file not found"), (no_image, "no image")):
        f = _write_rows(tmp_path, [GOOD, bad])
        runs = tmp_path / "runs"
        r = cli("align", "--method", "reper", "--model", model, "--data", f, "--set", "steps=1", "-o", runs)
        assert r.code == 2, r.err
        assert f"{f}:2:" in r.err.strip().splitlines()[0] and phrase in r.err.strip().splitlines()[0], r.err
        assert not list(runs.glob("*/artifacts/*/*"))


# the stages --------------------------------------------------------------------------------------------------------

def _fixed_dialogues(tmp_path, count: int = 12) -> str:
    from llmx.plugins.reper.build import dialogues

    sc = scenes(count, "train", 5, objects=2)
    rows, stats = dialogues(sc, [[corrupt(s, k, random.Random(i)) for k in range(8)] for i, s in enumerate(sc)],
                            C.RuleCritic(), 4, 6, 3, [0, 0, 1], 0)
    assert stats["dialogues"] == len(rows) >= count // 2
    (tmp_path / "images").mkdir(exist_ok=True)
    lines = []
    for k, d in enumerate(rows):
        d.image.image().save(tmp_path / f"images/{k}.png")
        lines.append(json.dumps(d.row(f"images/{k}.png")) + "\n")
    (tmp_path / "dialogues.jsonl").write_text("".join(lines))
    return str(tmp_path / "dialogues.jsonl")


def _run(model: str, stages: list[dict], tmp_path, device: str = "cpu") -> list[dict]:
    from llmx import api

    out = api.run({"model": model, "threads": 1, "seed": 0, "device": device, "pipeline": stages},
                  output_dir=tmp_path / "runs")
    return [s["metrics"] for s in out["stages"]]


def test_rpl_pushes_first_answers_down_and_last_up_where_sft_raises_both(tmp_path):
    data = _fixed_dialogues(tmp_path)
    common = {"data": data, "steps": 12, "batch_size": 4, "lr": 1e-3, "warmup": 0, "save": False}
    rpl, sft = (_run("ref:llava-test", [{"method": "reper", "stage": "align", "params": {**common, "objective": o}}],
                     tmp_path)[0] for o in ("rpl", "sft_all"))
    assert rpl["logp_first_after"] < rpl["logp_first_before"] and rpl["logp_last_after"] > rpl["logp_last_before"]
    assert sft["logp_first_after"] > sft["logp_first_before"] and sft["logp_last_after"] > sft["logp_last_before"]
    assert rpl["logp_first_before"] == sft["logp_first_before"]


def _trained_pairs(llava, tmp_path, objective: str, steps: int = 8):
    """Single-turn log-probs of each dialogue's best and worst answers before and after training on ``objective``."""
    import copy

    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.train.loop import TrainConfig, train
    from llmx.plugins.reper import train as R
    from llmx.plugins.reper.config import RPLParams
    from llmx.plugins.reper.pack import pack

    model, proc = copy.deepcopy(llava[0]), llava[1]
    n, pad = image_tokens(model), proc.tokenizer.pad_token_id
    dias = [d for d in load(_fixed_dialogues(tmp_path)) if len(d.answers) > 1]
    p = RPLParams(objective=objective, batch_size=4, lr=1e-3, steps=steps, warmup=0)
    best = examples(proc, [d.conversation([len(d.answers) - 1]) for d in dias], n, 1024)
    worst = examples(proc, [d.conversation([0]) for d in dias], n, 1024)
    packs = [pack(proc, d, n, 1024, "linear") for d in dias]
    loss, weight, _ = R.objective(model, proc, dias, packs, p, 0, pad, n)
    with torch.no_grad():
        before = R.sequence_logps(model, best, pad), R.sequence_logps(model, worst, pad)
    first = loss(0)
    train(model, T.trainable(model, 2), loss, TrainConfig(steps=steps, lr=1e-3, warmup=0), weight=weight)
    with torch.no_grad():
        after = R.sequence_logps(model, best, pad), R.sequence_logps(model, worst, pad)
    return first, before, after, loss


def test_dpo_starts_at_log_two_and_widens_the_best_worst_margin(llava, tmp_path):
    (value, stats), (bw, ww), (ba, wa), loss = _trained_pairs(llava, tmp_path, "dpo")
    assert value.item() == pytest.approx(math.log(2), abs=1e-5) and abs(stats["reward_margin"].item()) < 1e-5
    assert ((ba - wa) - (bw - ww)).mean() > 0
    later, stats = loss(0)  # the reference stays the starting policy
    assert later.item() < math.log(2) and stats["reward_margin"].item() > 0


def test_lipo_of_two_answers_labelled_one_and_zero_is_dpo_times_its_lambda_weight():
    from llmx.core import preference as P

    g = torch.Generator().manual_seed(0)
    pi_w, pi_l, ref_w, ref_l = (-torch.rand(6, generator=g) * 20 for _ in range(4))
    beta = 0.1
    weight = 1 - 1 / math.log2(3)  # |G_1 - G_0| = 1, |1/log2(2) - 1/log2(3)|
    for rewards, labels in ((torch.stack([pi_w - ref_w, pi_l - ref_l], 1), [1.0, 0.0]),
                            (torch.stack([pi_l - ref_l, pi_w - ref_w], 1), [0.0, 1.0])):
        lipo = P.lipo_lambda_loss(beta * rewards, torch.tensor([labels] * 6))
        assert torch.allclose(lipo, weight * P.dpo_loss(pi_w, pi_l, ref_w, ref_l, beta), atol=1e-6)


def test_lipo_is_invariant_to_a_constant_shift_and_ignores_absent_answers():
    from llmx.core import preference as P

    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(5, 4, generator=g)
    labels = torch.rand(5, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    loss = P.lipo_lambda_loss(rewards, labels, mask)
    for shift in (-7.5, 3.0, 100.0):
        assert torch.allclose(P.lipo_lambda_loss(rewards + shift, labels, mask), loss, atol=1e-5)
    assert loss[4] == 0 and (loss[:4] > 0).all()  # a list of one has no pair
    junk = torch.where(mask, rewards, torch.full_like(rewards, 1e4))
    assert torch.equal(P.lipo_lambda_loss(junk, torch.where(mask, labels, torch.full_like(labels, 50.0)), mask), loss)
    assert torch.allclose(P.lipo_lambda_loss(rewards[1:2, :3], labels[1:2, :3]), loss[1:2])


def test_lipo_on_three_answers_by_hand():
    from llmx.core import preference as P

    s = torch.tensor([[0.5, -0.2, 1.0]], requires_grad=True)
    psi = torch.tensor([[1.0, 0.0, 0.5]])
    # ranks by s: third 1, first 2, second 3 -> 1/D = 1/log2(3), 1/log2(4) = 0.5, 1/log2(2) = 1; gains 2^psi - 1
    d1, d2, d3 = 1 / math.log2(3), 0.5, 1.0
    g1, g2, g3 = 1.0, 0.0, math.sqrt(2) - 1

    def nls(x):
        return math.log1p(math.exp(-x))  # -log sigma(x)

    want = (abs(g1 - g2) * abs(d1 - d2) * nls(0.5 + 0.2)      # psi: first > second: 0.13093 x 0.40319
            + abs(g1 - g3) * abs(d1 - d3) * nls(0.5 - 1.0)    # first > third: 0.21620 x 0.97408
            + abs(g3 - g2) * abs(d3 - d2) * nls(1.0 + 0.2))   # third > second: 0.20711 x 0.26328
    loss = P.lipo_lambda_loss(s, psi)
    assert loss.item() == pytest.approx(want, rel=1e-6) and want == pytest.approx(0.31791, abs=1e-5)
    (grad,) = torch.autograd.grad(loss.sum(), s)  # the lambda weights are constants
    sig = torch.sigmoid
    w12, w13 = abs(g1 - g2) * abs(d1 - d2), abs(g1 - g3) * abs(d1 - d3)
    g_first = -w12 * (1 - sig(torch.tensor(0.7))) - w13 * (1 - sig(torch.tensor(-0.5)))
    assert grad[0, 0].item() == pytest.approx(g_first.item(), rel=1e-5)


def test_lipo_labels_are_win_rates_or_scores():
    from llmx.plugins.reper.train import lipo_labels

    d = Dialogue("d", SCENE, QUESTION, ["a", "b", "c"], ["f", "g"], [1, 2, 3], [2, 5, 9], [None] * 3)
    assert lipo_labels(d, "winrate") == [0.0, 0.5, 1.0]
    assert lipo_labels(d, "score") == pytest.approx([1 / 9, 4 / 9, 8 / 9])
    tied = Dialogue("d", SCENE, QUESTION, ["a", "b", "c"], ["f", "g"], [1, 2, 3], [4, 4, 9], [None] * 3)
    assert lipo_labels(tied, "winrate") == [0.25, 0.25, 1.0]
    bare = Dialogue("d", SCENE, QUESTION, ["a", "b"], ["f"], [1, 2], [None, None], [None] * 2)
    assert lipo_labels(bare, "winrate") == [0.0, 1.0]
    with pytest.raises(UsageError, match="score on every answer"):
        lipo_labels(bare, "score")


def test_lipo_trains_on_each_dialogue_as_a_list_and_widens_the_best_worst_margin(llava, tmp_path):
    (value, stats), (bw, ww), (ba, wa), loss = _trained_pairs(llava, tmp_path, "lipo")
    assert value.item() > 0 and abs(stats["reward_margin"].item()) < 1e-5  # the policy is the reference
    assert ((ba - wa) - (bw - ww)).mean() > 0
    later, stats = loss(0)
    assert later.item() < value.item() and stats["reward_margin"].item() > 0


def test_sft_on_the_best_answer_raises_the_best_more_than_the_worst(llava, tmp_path, monkeypatch):
    from llmx.plugins.reper import train as R

    seen = []
    real = R.examples
    monkeypatch.setattr(R, "examples", lambda proc, convs, *a: seen.extend(convs) or real(proc, convs, *a))
    _, (bw, ww), (ba, wa), _ = _trained_pairs(llava, tmp_path, "sft_best")
    assert ((ba - bw) - (wa - ww)).mean() > 0 and (ba - bw).mean() > 0
    best = [d.answers[-1] for d in load(tmp_path / "dialogues.jsonl") if len(d.answers) > 1]
    assert all([m["role"] for m in c.messages] == ["user", "assistant"] for c in seen)
    assert [c.messages[1]["content"] for c in seen] == best


@pytest.mark.parametrize("settings", [{"granularity": "sequence"}, {"reduction": "sum"}, {"ul_tokens": "differing"},
                                      {"alpha": 0.0}])
def test_the_rpl_stage_passes_its_settings_to_the_loss(llava, settings):
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.preference import token_logps
    from llmx.plugins.reper import train as R
    from llmx.plugins.reper.config import RPLParams
    from llmx.plugins.reper.pack import batch, pack

    model, proc = llava
    tok = proc.tokenizer
    answers = ["There is one digit. A small red two is at the top left.", "There are three digits.",
               _caption([o.key() for o in SCENE.objects], SCENE.relations)]
    packs = [pack(proc, _dialogue(SCENE, answers[k:]), image_tokens(model), 1024, "linear") for k in range(3)]
    p = RPLParams(batch_size=3, **settings)
    with torch.no_grad():
        value, _ = R.rpl_loss(model, packs, p, 0, tok.pad_token_id, tok.eos_token_id)(0)
        default, _ = R.rpl_loss(model, packs, RPLParams(batch_size=3), 0, tok.pad_token_id, tok.eos_token_id)(0)
        b = batch(packs, tok.pad_token_id, "cpu", tok.eos_token_id, p.ul_tokens == "differing")
        lp = token_logps(model(**b.inputs).logits, b.inputs["input_ids"])
    expected, _ = reflective_unlikelihood(lp, b.turn_masks, b.sigma, p.alpha, p.eps, p.granularity, p.reduction,
                                          b.ul_masks)
    assert value.item() == pytest.approx(expected.mean().item(), rel=1e-5) and value.item() != pytest.approx(default.item())


def test_the_rpl_stage_hands_the_eos_id_to_the_masks(llava, monkeypatch):
    from llmx.core.multimodal.model import image_tokens
    from llmx.plugins.reper import train as R
    from llmx.plugins.reper.config import RPLParams
    from llmx.plugins.reper.pack import pack

    model, proc = llava
    tok = proc.tokenizer
    seen = []
    real = R.batch
    monkeypatch.setattr(R, "batch", lambda *a: seen.append(a[3]) or real(*a))
    packs = [pack(proc, _dialogue(SCENE, ["There is one digit.", "There are three digits."]), image_tokens(model),
                  1024, "linear")]
    with torch.no_grad():
        R.objective(model, proc, [], packs, RPLParams(batch_size=1), 0, tok.pad_token_id, 1)[0](0)
    assert seen == [tok.eos_token_id]


def test_a_dialogue_over_the_context_loses_its_earliest_answers_at_inference(llava):
    from llmx.core.eval.generate import context_limit
    from llmx.plugins.reper.turns import fit

    model, proc = llava
    long = " ".join(f"q{i}z" for i in range(150))
    msgs = [{"role": "user", "content": QUESTION}]
    for k in range(4):
        msgs += [{"role": "assistant", "content": f"{k} {long}"}, {"role": "user", "content": f"feedback {k}"}]
    kept = fit(model, proc, msgs, 100)
    assert kept[0] == msgs[0] and kept[-1] == msgs[-1] and kept[1:] == msgs[len(msgs) - len(kept) + 1:]
    assert 1 < len(kept) < len(msgs) and context_limit(model) == 1024
    assert fit(model, proc, msgs[:3], 100) == msgs[:3]


@pytest.mark.parametrize("objective", ["sft_best", "dpo", "lipo"])
def test_the_baselines_train_on_the_same_dialogues(tmp_path, objective):
    data = _fixed_dialogues(tmp_path)
    multi = sum(len(load(data)[k].answers) > 1 for k in range(len(load(data))))
    out = _run("ref:llava-test", [{"method": "reper", "stage": "align", "params": {
        "data": data, "objective": objective, "steps": 2, "batch_size": 2, "save": False}}], tmp_path)[0]
    assert out["trained_rows"] == (multi if objective in ("dpo", "lipo") else len(load(data)))
    assert math.isfinite(out["final_loss"])


def test_one_trial_is_the_greedy_caption_and_later_turns_read_the_feedback(llava):
    from llmx.core.multimodal.answer import reply
    from llmx.plugins.reper.turns import converse

    model, proc = llava
    sc = scenes(3, "test", 2)
    one, dropped = converse(model, proc, sc, [QUESTION] * 3, C.RuleCritic(), 1, 24)
    assert dropped == 0
    assert [d[0].answer for d in one] == reply(model, proc, [[{"role": "user", "content": QUESTION}]] * 3, sc, 24)
    two, _ = converse(model, proc, sc, [QUESTION] * 3, C.RuleCritic(), 2, 24)
    assert [d[0] for d in two] == [d[0] for d in one]
    asked = [[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": d[0].answer},
              {"role": "user", "content": d[0].feedback}] for d in one]
    assert [d[1].answer for d in two] == reply(model, proc, asked, sc, 24)


def test_the_smoke_pipeline_builds_trains_and_reflects_and_its_items_average_to_the_figures(tmp_path):
    out = _run("ref:llava-test", [
        {"method": "reper", "stage": "analyze", "params": {"scenes": 6, "candidates": "corrupt"}},
        {"method": "reper", "stage": "align", "params": {"steps": 2, "batch_size": 2, "save": False}},
        {"method": "reper-decode", "stage": "decode", "params": {"scenes": 3, "max_trials": 2,
                                                                  "max_new_tokens": 16, "noise": 0.3}}], tmp_path)
    assert out[0]["dialogues"] == out[1]["dialogues"] > 0
    assert sum(out[0][f"dialogues_{t}_turns"] for t in (1, 2, 3)) == out[0]["dialogues"]
    assert {"turn1_f1", "turn2_hallucination", "final_rubric"} <= set(out[2])
    (items,) = (tmp_path / "runs").glob("*/artifacts/2_reper/items.jsonl")  # what llmx compare reper pairs
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    assert [r["scene"] for r in rows] == [0, 1, 2] and len({r["item"] for r in rows}) == 3
    for key in ("final_f1", "final_precision", "final_rubric", "turn1_f1", "turn2_recall"):
        assert sum(r[key] for r in rows) / len(rows) == pytest.approx(out[2][key]), key
    assert sum(r["final_critic_score"] for r in rows) / len(rows) == pytest.approx(out[2]["final_critic_score"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reper_runs_on_cuda(tmp_path):
    out = _run("ref:llava-test", [
        {"method": "reper", "stage": "analyze", "params": {"scenes": 8, "temperatures": [0.0, 1.0], "score_gap": 0,
                                                            "min_score": 1, "max_new_tokens": 16}},
        {"method": "reper", "stage": "analyze", "params": {"scenes": 8, "candidates": "corrupt"}},
        {"method": "reper", "stage": "align", "params": {"steps": 2, "batch_size": 2, "save": False,
                                                          "ul_tokens": "differing"}},
        {"method": "reper", "stage": "align", "params": {"steps": 2, "batch_size": 2, "save": False,
                                                          "objective": "dpo"}},
        {"method": "reper", "stage": "align", "params": {"steps": 2, "batch_size": 2, "save": False,
                                                          "objective": "lipo"}},
        {"method": "reper", "stage": "decode", "params": {"scenes": 4, "max_trials": 2, "max_new_tokens": 16,
                                                           "feedback": "kind"}}],
        tmp_path, device="cuda")
    assert all(math.isfinite(out[k]["final_loss"]) for k in (2, 3, 4))


def test_a_scenes_item_is_its_place_and_content_not_the_answers():
    from llmx.plugins.reper.method import items
    from llmx.plugins.reper.turns import Turn

    sc = scenes(3, "test", 0)

    def ids(images, answer):
        turns = [[Turn(answer, 1, "")] for _ in images]
        return [r["item"] for r in items(images, turns, [t[0] for t in turns])]

    first = ids(sc, "a red digit")
    assert len(set(first)) == 3 and ids(sc, "two blue digits") == first  # another policy's answers
    assert ids(sc[:2], "x") == first[:2] and not set(ids(scenes(3, "test", 1), "x")) & set(first)


def test_the_comparison_has_a_lipo_baseline_and_rpl_with_the_kind_critic_throughout():
    from llmx.core.plugins import host

    spec = host().comparisons["reper"]
    assert {"lipo", "rpl-kind", "dpo"} <= set(spec.judged) and spec.evaluation is None
    lipo, dpo, rpl, kind = (spec.arm(a).stages for a in ("lipo", "dpo", "rpl", "rpl-kind"))
    assert lipo[2]["params"] == {**dpo[2]["params"], "objective": "lipo"}  # same steps, rows, batch and rate
    assert [s["params"].get("feedback") for s in kind] == [None, "kind", None, "kind"]
    assert kind[2] == rpl[2] and [s["params"].get("feedback") for s in rpl] == [None] * 4
    assert spec.arm("base").stages == (rpl[0], rpl[-1])  # every arm: the same captioner, the same 3 turns
    assert all(spec.arm(a.name).stages[0]["method"] == "llava" for a in spec.arms)
    assert spec.cost_key == "reper.steps"  # the align stage's steps, not the captioner's (it reports steps first)


def test_an_identical_build_is_read_back_and_a_changed_or_damaged_one_is_built(tmp_path, monkeypatch):
    """The reper comparison's five arms open with the same build on a seed: the second run reads the first's
    dialogues (the sampler is never called) and gets the same rows and figures; another param, a damaged entry or
    LLMX_STAGE_CACHE=0 builds anew (the sampler is called)."""
    from pathlib import Path

    from llmx.core import stagecache
    from llmx.errors import RunFailed
    from llmx.plugins.reper import build as B

    monkeypatch.setattr(stagecache, "_where", lambda kind, digest: tmp_path / "stages" / kind / digest)
    stage = {"method": "reper", "stage": "analyze", "params": {"scenes": 6, "max_new_tokens": 12, "min_score": 1,
                                                               "score_gap": 0, "candidates": "corrupt"}}
    first = _run("ref:llava-test", [stage], tmp_path / "a")[0]
    rows = Path(first["data"]).read_text()
    real = B.candidates

    def never(*args, **kwargs):
        raise AssertionError("an identical build sampled again")

    monkeypatch.setattr(B, "candidates", never)
    again = _run("ref:llava-test", [stage], tmp_path / "b")[0]
    assert Path(again["data"]).read_text() == rows and again["data"] != first["data"]
    assert {k: v for k, v in again.items() if k != "data"} == {k: v for k, v in first.items() if k != "data"}
    other = {**stage, "params": {**stage["params"], "scenes": 7}}
    with pytest.raises(RunFailed, match="identical build sampled again"):  # another param: built, so sampled
        _run("ref:llava-test", [other], tmp_path / "c")
    (kept,) = (tmp_path / "stages" / "reper-build").glob(f"{first['build_key']}/dialogues.jsonl")
    kept.write_text(rows[: len(rows) // 2])  # a truncated entry is not trusted
    with pytest.raises(RunFailed, match="identical build sampled again"):
        _run("ref:llava-test", [stage], tmp_path / "d")
    monkeypatch.setattr(B, "candidates", real)
    assert Path(_run("ref:llava-test", [stage], tmp_path / "e")[0]["data"]).read_text() == rows  # rebuilt whole
    monkeypatch.setattr(B, "candidates", never)
    monkeypatch.setenv("LLMX_STAGE_CACHE", "0")
    with pytest.raises(RunFailed, match="identical build sampled again"):
        _run("ref:llava-test", [stage], tmp_path / "f")
