"""Alignment stages: data errors with line numbers, exact reductions through the whole stage, every method and data
kind runs, a new order every epoch and exact resume of an align run, KTO's reference point, PIPA's defaults, one
end-of-turn for chat-rendered rows, and the brackets task's checker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from safetensors.torch import load_file

DATA = ROOT / "configs" / "smoke" / "data"


def align(cli, tmp_path, method, kind, *sets, steps=3):
    r = cli("--json", "align", "--method", method, "--model", "ref:llama-test", "--data", DATA / f"brackets_{kind}.jsonl",
            "--set", f"steps={steps}", "--set", "batch_size=4", "--set", "max_len=96", *sets, "-o", tmp_path)
    assert r.code == 0, r.err
    return r.json()["stages"][0]["metrics"]


def test_bad_rows_name_the_file_and_line(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    r = cli("align", "--method", "pipa", "--model", "ref:llama-test", "--data", bad, "-o", tmp_path / "runs")
    assert r.code == 2 and f"{bad}:2:" in r.err and "Traceback" not in r.err
    assert list((tmp_path / "runs").iterdir()) == []
    for text, message in [('{"prompt": 1, "chosen": "b", "rejected": "c"}', "non-empty string"),
                          ('{"prompt": "a", "completion": "b", "label": "yes"}', "true or false"),
                          ('{"prompt": "a", "steps": ["x"], "labels": [true, false]}', "one per step"),
                          ("not json", "not valid JSON")]:
        bad.write_text(text + "\n")
        r = cli("align", "--method", "pipa", "--model", "ref:llama-test", "--data", bad, "-o", tmp_path / "runs")
        assert r.code == 2 and f"{bad}:1:" in r.err and message in r.err, text
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "completion": "b", "label": true}\n')
    r = cli("align", "--method", "dpo", "--model", "ref:llama-test", "--data", mixed, "-o", tmp_path / "runs")
    assert r.code == 2 and "unpaired row in a file of paired rows" in r.err


def test_method_refuses_the_wrong_kind_of_data(cli, tmp_path):
    r = cli("align", "--method", "kto", "--model", "ref:llama-test", "--data", DATA / "brackets_paired.jsonl",
            "-o", tmp_path)
    assert r.code == 2 and "kto trains on unpaired data" in r.err


def test_pipa_n_on_pairs_trains_exactly_like_dpo(cli, tmp_path):
    dpo = align(cli, tmp_path / "d", "dpo", "paired", "--set", "beta=0.5", "--set", "save=true")
    pipa = align(cli, tmp_path / "p", "pipa", "paired", "--set", "beta=0.5", "--set", "variant=n",
                 "--set", "pair_mode=conditional", "--set", "save=true")
    assert pipa["final_loss"] == dpo["final_loss"] and pipa["pair_mode"] == "conditional"
    a = load_file(f"{dpo['model_dir']}/model.safetensors")
    b = load_file(f"{pipa['model_dir']}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method,kind,sets", [
    ("simpo", "paired", []), ("ipo", "paired", []), ("kto", "unpaired", []),
    ("kto", "unpaired", ["--set", "reference_point=batch_self"]), ("confpo", "paired", []),
    ("confpo", "paired", ["--set", "base=dpo"]), ("pipa", "paired", ["--set", "variant=m"]),
    ("pipa", "unpaired", ["--set", "variant=m"]), ("pipa", "unpaired", []),
    ("pipa", "steps", []), ("pipa", "steps", ["--set", "variant=m"]),
])
def test_every_method_and_data_kind_trains(cli, tmp_path, method, kind, sets):
    m = align(cli, tmp_path, method, kind, *sets)
    assert m["steps"] == 3 and m["final_loss"] == m["final_loss"]  # finite (not NaN)
    assert 0.0 <= m["heldout_pref_accuracy"] <= 1.0
    lines = list(tmp_path.glob("*/artifacts/0_*/metrics.jsonl"))[0].read_text().splitlines()
    assert len(lines) == 3 and "loss" in json.loads(lines[0])


def test_every_epoch_has_its_own_order_and_a_resumed_run_replays_the_same_batches(cli, tmp_path, monkeypatch):
    from llmx.core.train.align import run as R

    batches: list[list[int]] = []
    real = R.logps

    def spy(policy, reference, g_head, batcher, idx, objective):
        if not isinstance(objective, R._EvalView):  # a training micro-batch, not the held-out evaluation
            batches.append(list(idx))
        return real(policy, reference, g_head, batcher, idx, objective)

    monkeypatch.setattr(R, "logps", spy)
    full = align(cli, tmp_path / "a", "dpo", "paired", "--set", "checkpoint_every=3", "--set", "save=true", steps=6)
    n, rows = full["train_rows"], [k for b in batches for k in b]
    assert 2 * n <= len(rows) == 24
    first, second = rows[:n], rows[n:2 * n]
    assert sorted(first) == sorted(second) == list(range(n)) and first != second  # each epoch reshuffled
    uninterrupted, batches[:] = list(batches), []
    ckpt = next((tmp_path / "a").glob("*/artifacts/0_dpo/checkpoints/step_3"))
    resumed = align(cli, tmp_path / "b", "dpo", "paired", "--set", f"resume={ckpt}", "--set", "save=true", steps=6)
    assert batches == uninterrupted[3:]  # steps 4-6, across the epoch boundary, as the uninterrupted run
    a = load_file(f"{full['model_dir']}/model.safetensors")
    b = load_file(f"{resumed['model_dir']}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_kto_run_scores_its_reference_point_on_other_rows_completions(cli, tmp_path, monkeypatch):
    """Through the stage: every training micro-batch's KL forward holds the batch's own prompts, each with the
    completion of the row before it in the first epoch's order (not its own)."""
    from llmx.core.data.sampling import EpochOrder
    from llmx.core.train.align import run as R

    calls: list[tuple[str, R.Batcher, list[int]]] = []
    real_kl, real_logps = R.kl_logps, R.logps

    def kl_spy(policy, reference, pairs, idx):
        calls.append(("kl", pairs, list(idx)))
        return real_kl(policy, reference, pairs, idx)

    def logps_spy(policy, reference, g_head, batcher, idx, objective):
        if not isinstance(objective, R._EvalView):
            calls.append(("own", batcher, list(idx)))
        return real_logps(policy, reference, g_head, batcher, idx, objective)

    monkeypatch.setattr(R, "kl_logps", kl_spy)
    monkeypatch.setattr(R, "logps", logps_spy)
    m = align(cli, tmp_path, "kto", "unpaired", steps=2)
    assert [c[0] for c in calls] == ["kl", "own"] * 2 and all(a[2] == b[2] for a, b in zip(calls[::2], calls[1::2], strict=True))
    own, pairs = calls[1][1], calls[0][1]
    perm = EpochOrder(m["train_rows"], 0).perm(0)  # the run's seed is 0
    partner = {perm[k]: perm[k - 1] for k in range(len(perm))}
    for _, _, idx in calls[::2]:
        for r in idx:
            mine, kl, theirs = own.encoded[r][0], pairs.encoded[r][0], own.encoded[partner[r]][0]
            assert kl.ids[:kl.start] == mine.ids[:mine.start] and kl.ids[kl.start:] == theirs.ids[theirs.start:]
    assert sum(pairs.encoded[r][0].ids != own.encoded[r][0].ids for _, _, idx in calls[::2] for r in idx) > 0
    metrics = tmp_path.glob("*/artifacts/0_kto/metrics.jsonl")
    assert all("kl_estimate" in json.loads(line) for line in next(metrics).read_text().splitlines())


def test_kto_reference_point_is_trls_kl_term_on_mismatched_pairs():
    """On a hand-made micro-batch, z_ref is TRL's formula computed here on its own: each prompt scored alone with
    another row's completion (the completions shifted by one row of the order) under the policy and the reference,
    ``max(0, mean(log pi(y'|x) - log ref(y'|x)))``."""
    from llmx.core.models.archs import build_random
    from llmx.core.train.align import run as R
    from llmx.core.train.align.data import Example
    from llmx.plugins.align_baselines.config import KTOParams
    from llmx.plugins.align_baselines.objectives import KTO

    policy, tok = build_random("llama", seed=0)
    other = build_random("llama", seed=1)[0]
    completions = ["a)", "b, c)", "dd)", "(e))", "f)"]
    rows = [Example(f"x{i} = f(", completion=c, label=i % 2 == 0) for i, c in enumerate(completions)]
    rows_b = R.Batcher(tok, "unpaired", rows, 64)
    perm, idx = [3, 0, 4, 1, 2], [0, 1, 2, 3]
    partner = {perm[k]: perm[k - 1] for k in range(len(perm))}  # TRL: completions shifted by one row

    @torch.no_grad()
    def completion_logp(model, prompt_of: int, completion_of: int) -> float:
        own, theirs = rows_b.encoded[prompt_of][0], rows_b.encoded[completion_of][0]
        ids = own.ids[:own.start] + theirs.ids[theirs.start:]
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        return float(lp.gather(1, torch.tensor(ids[1:])[:, None])[own.start - 1:].sum())

    def trl_kl(pi_model, ref_model) -> float:
        return sum(completion_logp(pi_model, r, partner[r]) - completion_logp(ref_model, r, partner[r])
                   for r in idx) / len(idx)

    if trl_kl(policy, other) < 0:  # so the clamp at 0 does not hide the value
        policy, other = other, policy
    expected = trl_kl(policy, other)
    reference = R.Reference(policy, held=other)
    pairs = R.mismatched(rows_b, perm, 64)
    assert all(pairs.encoded[r][0].ids[pairs.encoded[r][0].start:] == rows_b.encoded[partner[r]][0].ids[
        rows_b.encoded[partner[r]][0].start:] and partner[r] != r for r in range(5))
    kto = KTO(KTOParams(data="x"))
    b = R.logps(policy, reference, None, rows_b, idx, kto)
    b.kl_pi, b.kl_ref = R.kl_logps(policy, reference, pairs, idx)
    z = kto.loss(b)[1]["kl_estimate"][0]
    assert expected > 0 and float(z) == pytest.approx(expected, rel=1e-4, abs=1e-5)
    own = KTO(KTOParams(data="x", reference_point="batch_self")).loss(b)[1]["kl_estimate"][0]
    assert float(own) != pytest.approx(float(z), rel=1e-3)  # the batch's own completions: another estimate


def test_brackets_checker():
    from llmx.plugins.tasks.brackets import balanced, judge, rows

    assert balanced("f(a, [b, {c: d}])") and not balanced("f(a, [b)]") and not balanced("f((a)")
    assert balanced("print('(')") and not balanced(")(")
    row = {"prompt": "x = f("}
    assert judge(row, "a, b)\n") and not judge(row, "a, b)") and not judge(row, "a, (b)\n")
    train, val = ({r["prompt"] for r in rows(split, 0)} for split in ("train", "validation"))
    assert len(train) > 1000 and all(p.endswith("(") for p in train)
    assert len(train & val) < 0.05 * len(val)  # files never mix; a few snippets recur verbatim across stdlib files


def test_both_sides_of_a_truncated_pair_keep_the_same_prompt_tokens():
    from llmx.core.models.archs import build_random
    from llmx.core.train.align.batch import encode

    _, tok = build_random("llama")
    prompt = "x = compute(" * 20  # 240 byte tokens: far past any budget
    short, long = encode(tok, prompt, "1)", 128), encode(tok, prompt, "a, b, c, d, e, f, g, h)" * 8, 128)
    assert short.prompt_cut and long.prompt_cut and long.response_cut and not short.response_cut
    assert short.ids[:short.start] == long.ids[:long.start] and short.start == 64  # half of max_len by default
    assert len(long.ids) == 128 and encode(tok, prompt, "1)", 128, 100).start == 100


def test_held_out_rows_share_no_prompt_with_training_rows(tmp_path):
    import json

    from llmx.core.data import holdout
    from llmx.core.train.align.data import load

    path = tmp_path / "unpaired.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i % 20}", "completion": f" c{i}", "label": i % 2 == 0}) + "\n"
                            for i in range(200)))
    _, rows = load(path)
    train, held = holdout(rows, key=lambda r: r.prompt)
    assert held and train and not {r.prompt for r in train} & {r.prompt for r in held}
    by_index = holdout(rows)
    assert {r.prompt for r in by_index[0]} & {r.prompt for r in by_index[1]}  # what splitting by row did


@pytest.fixture
def module_copies(monkeypatch) -> list[str]:
    """The class names of the modules ``copy.deepcopy`` is asked to copy during the test."""
    import copy

    copies, real = [], copy.deepcopy

    def spy(obj, *a, **k):
        if isinstance(obj, torch.nn.Module):
            copies.append(type(obj).__name__)
        return real(obj, *a, **k)

    monkeypatch.setattr(copy, "deepcopy", spy)
    return copies


def test_reference_free_methods_keep_no_copy_of_the_weights(cli, tmp_path, module_copies):
    copies = module_copies
    for method, expected in (("simpo", 0), ("dpo", 1)):
        copies.clear()
        m = align(cli, tmp_path / method, method, "paired", "--set", "save=false")
        assert len(copies) == expected, (method, copies)
        assert m["heldout_logratio_per_token"] != 0  # drift still measured, against the starting policy


def test_pipa_m_still_learns_on_the_smoke_pairs_after_20_steps(cli, tmp_path):
    def last(stabilizer):  # conditional pairs: there every chosen row reaches the bound
        align(cli, tmp_path / stabilizer, "pipa", "paired", "--set", "variant=m", "--set", "save=false",
              "--set", "pair_mode=conditional", "--set", f"m_stabilizer={stabilizer}", steps=20)
        lines = (tmp_path / stabilizer).glob("*/artifacts/0_pipa/metrics.jsonl")
        return json.loads(next(lines).read_text().splitlines()[-1])

    smooth, hard, penalty = last("softplus"), last("clamp"), last("penalty")
    assert smooth["bound_rate_chosen"] > 0 and hard["bound_rate_chosen"] == 1  # the chosen rows are past the bound
    assert smooth["grad_norm"] > 0.1 and hard["grad_norm"] < 1e-3  # ... where the hard clamp alone stops learning
    assert penalty["grad_norm"] > 0.1 and penalty["bound_rate_chosen"] < 1  # the default pulls them back


@pytest.mark.parametrize("variant", ["n", "m"])
def test_independent_pair_mode_is_the_unpaired_loss_on_both_labelled_sides(variant):
    from llmx.core import preference as P
    from llmx.core.train.align.run import LogpBatch
    from llmx.plugins.pipa.config import PIPAParams
    from llmx.plugins.pipa.objective import PIPA

    gen = torch.Generator().manual_seed(0)
    pi, ref = -torch.rand(6, 5, generator=gen) * 3, -torch.rand(6, 5, generator=gen) * 3
    g = torch.randn(3, generator=gen)
    b = LogpBatch("paired", pi, ref, torch.ones(6, 5), g=g)
    loss, _ = PIPA(PIPAParams(data="x", variant=variant, pair_mode="independent"), "paired").loss(b)
    s, r = pi.sum(-1), ref.sum(-1)
    fn = P.pipa_n_loss if variant == "n" else P.pipa_m_loss
    expected = (fn(s[:3], r[:3], g, torch.ones(3)) + fn(s[3:], r[3:], g, torch.zeros(3))) / 2
    assert torch.allclose(loss, expected)
    if variant == "n":  # the conditional reading is DPO: g cancels
        cond = PIPA(PIPAParams(data="x", variant="n", pair_mode="conditional"), "paired")
        assert cond.g is None and torch.allclose(cond.loss(b)[0], P.dpo_loss(s[:3], s[3:], r[:3], r[3:], 1.0))
        shifted = LogpBatch("paired", pi, ref, torch.ones(6, 5), g=g + 1)
        assert not torch.allclose(PIPA(PIPAParams(data="x", pair_mode="independent"), "paired").loss(shifted)[0], loss)


def test_pipa_on_pairs_defaults_to_the_papers_method_and_says_so(cli, tmp_path):
    r = cli("--json", "methods", "show", "pipa")
    params = {x["name"]: x for x in r.json()[0]["params"]}
    assert params["pair_mode"]["default"] == "independent" and "DPO-equivalent" in params["pair_mode"]["help"]
    assert params["m_stabilizer"]["default"] == "penalty"
    m = align(cli, tmp_path, "pipa", "paired")
    assert m["steps"] == 3 and m["pair_mode"] == "independent"
    assert len(list(tmp_path.glob("*/artifacts/0_pipa/g_head.safetensors"))) == 1  # g is learned


def test_sampled_completions_are_scored_without_an_eos_they_never_had():
    from llmx.core.models.archs import build_random
    from llmx.core.train.align.batch import encode

    _, tok = build_random("llama")
    with_eos, as_sampled = encode(tok, "f(", "x)\n", 64), encode(tok, "f(", "x)\n", 64, eos=False)
    assert with_eos.ids == as_sampled.ids + [tok.eos_token_id] and as_sampled.ids[-1] != tok.eos_token_id
    assert encode(tok, "f(", "", 64, eos=True).ids[-1] == tok.eos_token_id  # an empty sample is an EOS


def test_prompts_start_with_bos_for_tokenizers_that_expect_one_even_when_cut():
    from tokenizers import processors

    from llmx.core.tokenizer import byte_tokenizer
    from llmx.core.train.align.batch import encode

    tok = byte_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tok("ab")["input_ids"][0] == 1
    short, cut = encode(tok, "ab", "c", 64), encode(tok, "x" * 100, "c", 64)
    assert short.ids[:3] == [1] + tok("ab", add_special_tokens=False)["input_ids"]
    assert cut.prompt_cut and cut.ids[0] == 1 and cut.start == 32


@pytest.mark.parametrize("method,kind", [("dpo", "paired"), ("kto", "unpaired")])  # kto: its mismatched pairs too
def test_precomputed_reference_log_probs_train_exactly_like_a_frozen_copy(cli, tmp_path, module_copies, method, kind):
    copies = module_copies
    live = align(cli, tmp_path / "live", method, kind)
    assert copies
    copies.clear()
    pre = align(cli, tmp_path / "pre", method, kind, "--set", "precompute_ref_log_probs=true")
    assert not copies
    a, b = (load_file(str(Path(m["model_dir"]) / "model.safetensors")) for m in (live, pre))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert pre["heldout_pref_accuracy"] == live["heldout_pref_accuracy"]
    assert pre["heldout_logratio_per_token"] == pytest.approx(live["heldout_logratio_per_token"], abs=1e-6)


def test_a_file_whose_prompts_all_fall_held_out_is_a_usage_error(cli, tmp_path):
    from llmx.core.data import holdout

    prompt = next(f"p{i} =" for i in range(1000) if not holdout([f"p{i} ="], key=str)[0])
    data = tmp_path / "one_prompt.jsonl"
    data.write_text("".join(json.dumps({"prompt": prompt, "chosen": f" {i}", "rejected": f" {i + 1}"}) + "\n"
                            for i in range(20)))
    r = cli("align", "--method", "dpo", "--model", "tiny:llama", "--data", data, "-o", tmp_path / "out")
    assert r.code == 2 and "held-out split" in r.err  # split by row, 18 of these 20 rows would have trained


def test_disable_dropout_turns_off_attention_layers_own_rates():
    from transformers import AutoModelForCausalLM

    from llmx.core.models.archs import config
    from llmx.core.train.align.run import no_dropout

    for arch, rates in (("opt", {"dropout": 0.1, "attention_dropout": 0.1}), ("llama", {"attention_dropout": 0.1})):
        cfg = config(arch, vocab_size=259)
        for k, v in rates.items():
            setattr(cfg, k, v)
        model = AutoModelForCausalLM.from_config(cfg).train()
        x = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
        assert not torch.equal(model(input_ids=x).logits, model(input_ids=x).logits), arch
        no_dropout(model)
        assert torch.equal(model(input_ids=x).logits, model(input_ids=x).logits), arch


def test_max_prompt_length_must_be_below_max_len(cli, tmp_path):
    r = cli("align", "--method", "dpo", "--model", "tiny:llama", "--data", DATA / "brackets_paired.jsonl",
            "--set", "max_len=64", "--set", "max_prompt_length=64", "-o", tmp_path)
    assert r.code == 2 and "max_prompt_length (64) must be below max_len (64)" in r.err


def test_trl_format_and_conversational_preference_files_load_and_train(cli, tmp_path):
    from llmx.core.train.align.data import load

    rows = {
        "implicit.jsonl": [{"chosen": f"x{i} = f({i})", "rejected": f"x{i} = g({i}"} for i in range(12)],
        "conversational.jsonl": [{"prompt": [{"role": "user", "content": f"close f({i}"}],
                                  "chosen": [{"role": "assistant", "content": ")"}],
                                  "rejected": [{"role": "assistant", "content": "(("}]} for i in range(12)],
        "implicit_chat.jsonl": [{"chosen": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "ok"}],
                                 "rejected": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "no"}]}
                                for i in range(12)],
        "unpaired_chat.jsonl": [{"prompt": [{"role": "user", "content": f"q{i}"}],
                                 "completion": [{"role": "assistant", "content": "ok" if i % 2 else "no"}],
                                 "label": bool(i % 2)} for i in range(12)],
    }
    for name, lines in rows.items():
        (tmp_path / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    kind, implicit = load(tmp_path / "implicit.jsonl")
    assert kind == "paired" and (implicit[3].prompt, implicit[3].chosen, implicit[3].rejected) == ("x3 = ", "f(3)", "g(3")
    _, chat = load(tmp_path / "implicit_chat.jsonl")
    assert chat[0].prompt == [{"role": "user", "content": "q0"}] and chat[0].chosen[0]["content"] == "ok"
    for name, method in (("implicit.jsonl", "dpo"), ("conversational.jsonl", "dpo"), ("implicit_chat.jsonl", "simpo"),
                         ("unpaired_chat.jsonl", "kto")):
        r = cli("--json", "align", "--method", method, "--model", "tiny:llama", "--data", tmp_path / name,
                "--set", "steps=2", "--set", "batch_size=2", "--set", "max_len=48", "--set", "save=false",
                "-o", tmp_path / name.removesuffix(".jsonl"))
        assert r.code == 0, (name, r.err)


def test_conversations_render_with_the_chat_template_and_the_response_is_what_it_adds():
    from llmx.core.models.archs import build_random
    from llmx.core.train.align.batch import encode
    from llmx.core.train.align.chat import render

    _, tok = build_random("llama")
    prompt, reply = [{"role": "user", "content": "2+2"}], [{"role": "assistant", "content": "4"}]
    assert render(tok, prompt, reply) == ("user: 2+2\nassistant: ", "4")  # no template: the plain one
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    text, response = render(tok, prompt, reply)
    assert (text, response) == ("<user>2+2</><assistant>", "4</>")
    e = encode(tok, text, response, 64)
    assert tok.decode(e.ids[e.start:]) == "4</></s>"  # a string response gets its EOS


def test_a_chat_rendered_response_ends_with_one_end_of_turn_and_no_second_eos():
    from llmx.core.models.archs import build_random
    from llmx.core.train.align.data import Example
    from llmx.core.train.align.run import Batcher

    _, tok = build_random("llama")
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    end = tok.convert_tokens_to_ids("<|end|>")
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}<|end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    for end_token in ("<|end|>", tok.eos_token):  # an end-of-turn of its own, or the EOS as the end of the turn
        tok.chat_template = tok.chat_template.replace("<|end|>", end_token)
        last = end if end_token == "<|end|>" else tok.eos_token_id
        row = Example([{"role": "user", "content": "2+2"}], completion=[{"role": "assistant", "content": "4\n"}],
                      label=True)
        e = Batcher(tok, "unpaired", [row], 64).encoded[0][0]
        response = e.ids[e.start:]
        assert tok.decode(response) == f"4\n{end_token}" and response[-1] == last  # no newline after, no EOS again
        assert response.count(last) == 1 and response.count(tok.eos_token_id) == (last == tok.eos_token_id)
        plain = Batcher(tok, "unpaired", [Example("2+2=", completion="4", label=True)], 64).encoded[0][0]
        assert plain.ids[-1] == tok.eos_token_id  # a string row still gets its EOS
    tok.chat_template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")  # writes no end-of-turn token
    row = Example([{"role": "user", "content": "2+2"}], completion=[{"role": "assistant", "content": "4"}], label=True)
    e = Batcher(tok, "unpaired", [row], 64).encoded[0][0]
    assert e.ids[-1] == tok.eos_token_id and tok.decode(e.ids[e.start:-1]) == "4\n"  # its EOS is the only stop


def test_an_align_stage_without_data_trains_on_the_runs_own_judged_samples(tmp_path):
    """What ``llmx compare align / pipa / confpo`` runs: each arm samples and judges its own preference rows, then
    aligns on them; the rows' kind follows the method (KTO and PIPA's run_rows: unpaired take the labelled samples)."""
    from llmx import api
    from llmx.errors import UsageError

    short = {"steps": 1, "batch_size": 2, "max_len": 64, "save": False}
    run = lambda *stages: [s["metrics"] for s in api.run(  # noqa: E731
        {"model": "ref:llama-test", "threads": 1, "seed": 0, "pipeline": list(stages)},
        output_dir=tmp_path / "runs")["stages"]]
    made, dpo, kto, pipa = run(
        {"method": "task", "stage": "analyze", "params": {"task": "brackets", "splits": ["train"], "limit": 8,
                                                          "samples": 4}},
        {"method": "dpo", "params": short}, {"method": "kto", "params": short},
        {"method": "pipa", "params": {**short, "run_rows": "unpaired"}})
    assert (dpo["data_kind"], dpo["train_rows"] + dpo["eval_rows"]) == ("paired", made["train_paired"])
    assert (kto["data_kind"], kto["train_rows"] + kto["eval_rows"]) == ("unpaired", made["train_unpaired"])
    assert (pipa["data_kind"], pipa["train_rows"] + pipa["eval_rows"]) == ("unpaired", made["train_unpaired"])
    with pytest.raises(UsageError, match="no preference data: pass data"):
        run({"method": "confpo", "params": short})
