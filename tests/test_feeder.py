"""FEEDER (Jin et al., ICML 2025): the tree with the exact copier (sufficiency is sharing the query's cue), the set
paired against random subsets of its size, the default episode pool fitting the context uncut, the tree's cost
bound and cache, the measured pool-sufficiency rate, seeding, node-size caps, label-word scoring against hand sums,
the in-context episodes, the CLI stages and bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmx.core.data.icl import Format
from llmx.core.eval import icl
from llmx.core.eval.score import encode_pair
from llmx.errors import UsageError
from llmx.plugins.feeder import episodes as E
from llmx.plugins.feeder.oracle import CopyOracle, KnnOracle, Oracle
from llmx.plugins.feeder.tree import inferred, select, sufficient, versus_random

MODEL = "ref:llama-test"


class RuleOracle(Oracle):
    """Ψ(C, x) = x's label when some demonstration in C knows x (``knows[d]``), else a label no row has."""

    def __init__(self, knows):
        super().__init__([{"input": str(i), "label": "y"} for i in range(len(knows))], ["y", "none"])
        self.knows = knows

    def _answer(self, questions):
        return ["y" if any(x in self.knows[d] for d in demos) else "none" for demos, x in questions]


def pool(cues=12, rows=120, noise=0.0, seed=0):
    return E.heldout(E.Spec(cues=cues, labels=3, noise=noise), rows, 10, seed)


@pytest.mark.parametrize("depth", [1, 2, 3, None])
def test_tree_and_necessity_keep_exactly_one_row_per_cue(depth):
    made = pool()
    oracle = CopyOracle(made["pool"], made["labels"])
    sel = select(oracle, depth=depth, seed=3)
    cues = [made["pool"][i]["cue"] for i in sel.indices]
    assert sorted(cues) == sorted({r["cue"] for r in made["pool"]}) and sel.sufficiency_rate == 1.0
    assert sel.truncations == 0


def test_the_copier_finds_one_row_per_cue_sufficient_and_not_once_a_cues_only_row_is_gone():
    made = pool()
    oracle, everything = CopyOracle(made["pool"], made["labels"]), list(range(len(made["pool"])))
    first: dict[str, int] = {}
    for i, r in enumerate(made["pool"]):
        first.setdefault(r["cue"], i)
    one_per_cue = sorted(first.values())
    assert sufficient(oracle, [(one_per_cue, everything)]) == [True]
    gone = made["pool"][one_per_cue[0]]["cue"]
    assert sufficient(oracle, [(one_per_cue[1:], everything)]) == [False]
    failed = [x for x, ok in enumerate(inferred(oracle, one_per_cue[1:])) if not ok]
    assert failed == [x for x, r in enumerate(made["pool"]) if r["cue"] == gone]
    with pytest.raises(UsageError, match="no 'cue'"):
        CopyOracle([{"input": "bera", "label": "red"}], ["red", "blue"])


def test_the_set_beats_random_subsets_of_its_size_row_by_row():
    made = pool()  # 12 cues, 10 rows each: a random 12 rows miss cues
    oracle = CopyOracle(made["pool"], made["labels"])
    sel = select(oracle, seed=0)
    calls = oracle.calls
    vs = versus_random(oracle, sel.indices, sel.inferred, draws=8, seed=0)
    assert sel.sufficiency_rate == 1.0 and vs["subset_rows"] == len(sel.indices) == 12
    assert vs["random_sufficiency_rate"] < 0.9 and vs["sufficiency_minus_random_ci_low"] > 0
    assert vs["sufficiency_minus_random"] == pytest.approx(1.0 - vs["random_sufficiency_rate"])
    assert vs["losses"] == 0 and vs["wins"] > 0 and vs["oracle_calls"] == oracle.calls - calls <= 8 * 120
    capped = CopyOracle(made["pool"], made["labels"], max_node_size=5)  # subsets only as large as one prompt holds
    assert versus_random(capped, list(range(12)), [True] * 120, draws=2, seed=0)["subset_rows"] == 5


def test_the_default_episode_pool_fits_the_icl_models_context_so_no_node_is_cut():
    """The comparison's pool (icl-episodes' defaults) under ref:llama-icl's tokenizer and 64-token context: the whole
    pool fits one prompt beside the longest query and label, so even a random model, whose unions grow to the
    whole pool, never cuts a node (a 400-row pool forced 42-47 cuts a selection)."""
    from llmx.core.tokenizer import train_bpe
    from llmx.core.zoo.presets import PRESETS
    from llmx.plugins.feeder.config import EpisodeParams
    from llmx.plugins.feeder.oracle import LMOracle
    from llmx.plugins.feeder.plugin import EPISODES

    preset = PRESETS["icl"]["llama"]
    tok = train_bpe(E.documents("train"), preset.vocab)  # as the zoo trains ref:llama-icl's tokenizer
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=preset.seq_len)).eval()
    p = EpisodeParams(**EPISODES["params"])
    for seed in range(3):
        made = E.heldout(E.Spec(cues=p.cues, labels=p.labels, distractors=p.distractors, noise=p.noise), p.pool, 1,
                         seed)
        oracle = LMOracle(model, tok, E.FORMAT, made["pool"], made["labels"])
        assert oracle.fits(list(range(len(made["pool"]))))
        sel = select(oracle, seed=seed)
        assert sel.truncations == 0 and sel.levels[-1] == 1


def test_necessity_over_the_pool_drops_the_noisy_rows_that_self_keeps():
    """Under label noise a mislabelled row is inferred by nothing but itself, so ``self`` keeps it (and a clean
    partner); ``pool`` drops it when the rest still infers every row the set inferred (the notes' wording)."""
    made = pool(cues=8, rows=160, noise=0.15, seed=1)
    noisy = lambda idx: sum(made["pool"][i]["label"] != made["map"][made["pool"][i]["cue"]] for i in idx)  # noqa: E731
    by = {check: select(CopyOracle(made["pool"], made["labels"]), seed=2, necessity_check=check)
          for check in ("self", "pool")}
    assert noisy(by["self"].indices) > noisy(by["pool"].indices)
    assert len(by["pool"].indices) < len(by["self"].indices) and by["pool"].dropped_by_necessity > 0
    assert by["pool"].sufficiency_rate >= by["self"].sufficiency_rate - 1e-9


def test_the_parent_is_a_then_b_then_their_union():
    questions = set()
    for seed in range(8):  # the pairing varies: A = [0] keeps A (one question), A = [1] keeps B (two)
        oracle = RuleOracle({0: {0, 1}, 1: {1}})
        assert select(oracle, depth=1, necessity_pass=False, seed=seed).indices == [0]
        questions.add(oracle.calls - 1)  # the recount adds one new question, Ψ([0], 0)
    assert questions == {1, 2}
    assert select(RuleOracle({0: {0}, 1: {1}}), depth=1, necessity_pass=False).indices == [0, 1]


def test_the_tree_alone_shrinks_the_pool_and_stays_sufficient():
    made = pool()
    sel = select(CopyOracle(made["pool"], made["labels"]), depth=None, necessity_pass=False, seed=0)
    cues = len({r["cue"] for r in made["pool"]})
    assert sel.sufficiency_rate == 1.0 and cues < len(sel.indices) < len(made["pool"]) // 3
    assert sel.levels == sorted(sel.levels, reverse=True) and sel.levels[-1] == 1


@pytest.mark.parametrize("depth,rounds,repair", [(1, 1, False), (2, 1, False), (4, 1, False), (1, 3, False),
                                                 (2, 2, True)])
def test_oracle_calls_stay_within_c_n_k_and_repeats_hit_the_cache(depth, rounds, repair):
    made = pool(cues=20, rows=200, noise=0.05)
    oracle = KnnOracle(made["pool"], made["labels"])
    sel = select(oracle, depth=depth, rounds=rounds, repair_pass=repair, seed=1, necessity_check="self")
    n = len(made["pool"])
    # n per level, necessity, recount; with repair: a recount and a second necessity pass of at most n members
    assert sel.oracle_calls <= n * depth * rounds + 2 * n + (2 * n if repair else 0)
    pooled = select(KnnOracle(made["pool"], made["labels"]), depth=depth, rounds=rounds, repair_pass=repair, seed=1)
    grown = len(pooled.indices) + pooled.dropped_after_repair
    tree_set = grown + pooled.dropped_by_necessity - pooled.added_by_repair
    assert pooled.oracle_calls <= n * depth * rounds + tree_set * n + 2 * n + ((grown + 1) * n if repair else 0)
    before = oracle.calls
    again = oracle.ask([((0, 5, 9), 3), ((9, 0, 5), 3), ((0, 5, 9), 3)])
    assert oracle.calls == before + 1 and oracle.hits == sel.cache_hits + 2 and len(set(again)) == 1


def test_the_reported_sufficiency_rate_is_a_brute_force_recount():
    made = pool(cues=16, rows=160, noise=0.2)
    sel = select(KnnOracle(made["pool"], made["labels"]), depth=2, seed=4)
    fresh = KnnOracle(made["pool"], made["labels"])
    recount = [fresh.infers(sel.indices, x) for x in range(len(made["pool"]))]
    assert sel.inferred == recount and sel.sufficiency_rate == sum(recount) / len(recount)
    assert 0 < sel.sufficiency_rate < 1  # noisy rows cannot all be inferred: the rate is measured, not assumed
    outside = [ok for x, ok in enumerate(recount) if x not in sel.indices]
    assert sel.sufficiency_rate_nonmembers == sum(outside) / len(outside)


def test_the_pool_necessity_check_never_lowers_the_rate():
    made = pool(cues=16, rows=160, noise=0.2)
    for seed in range(3):
        keep = select(KnnOracle(made["pool"], made["labels"]), depth=2, seed=seed, necessity_pass=False)
        pooled = select(KnnOracle(made["pool"], made["labels"]), depth=2, seed=seed, necessity_check="pool")
        assert set(pooled.indices) <= set(keep.indices) and pooled.sufficiency_rate >= keep.sufficiency_rate


def test_the_same_seed_gives_the_same_set_and_seeds_matter():
    made = pool(cues=16, rows=160, noise=0.1)
    runs = {s: select(KnnOracle(made["pool"], made["labels"]), depth=3, seed=s).indices for s in range(4)}
    assert select(KnnOracle(made["pool"], made["labels"]), depth=3, seed=2).indices == runs[2]
    assert len({tuple(v) for v in runs.values()}) > 1


def test_repair_adds_rows_the_set_does_not_infer():
    made = pool(cues=16, rows=160, noise=0.2)
    plain = select(KnnOracle(made["pool"], made["labels"]), depth=2, seed=4)
    fixed = select(KnnOracle(made["pool"], made["labels"]), depth=2, seed=4, repair_pass=True)
    assert fixed.added_by_repair > 0 and fixed.sufficiency_rate > plain.sufficiency_rate


def test_a_repair_that_lowers_the_rate_is_reverted():
    made = pool(cues=8, rows=160, noise=0.15, seed=1)  # added mislabelled rows override clean ones for this seed
    plain = select(CopyOracle(made["pool"], made["labels"]), seed=2)
    fixed = select(CopyOracle(made["pool"], made["labels"]), seed=2, repair_pass=True)
    assert fixed.added_by_repair > 0 and fixed.dropped_after_repair > 0 and fixed.repair_reverted
    assert fixed.indices == plain.indices and fixed.sufficiency_rate == plain.sufficiency_rate
    for seed in range(4):
        grown = select(CopyOracle(made["pool"], made["labels"]), seed=seed, repair_pass=True)
        assert grown.sufficiency_rate >= select(CopyOracle(made["pool"], made["labels"]),
                                                seed=seed).sufficiency_rate


def test_a_node_past_max_node_size_is_cut_and_counted():
    rows = [{"input": f"w{i}", "label": "b"} for i in range(8)]  # no shared word: every pair is a union
    oracle = KnnOracle(rows, ["a", "b"], max_node_size=3)
    sel = select(oracle, depth=None, seed=0)
    assert (sel.truncations, sel.truncated_rows, len(sel.indices)) == (3, 5, 3)  # 4+4 -> 3+3, then 6 -> 3
    assert max(len(c) for c, _ in oracle.cache) <= 3
    with pytest.raises(ValueError, match="does not fit one prompt"):
        oracle.ask([((0, 1, 2, 3), 4)])


def test_a_redundancy_cut_drops_repeated_cues_before_new_ones():
    made = pool(cues=6, rows=48, noise=0.0, seed=1)
    cues = lambda sel: {made["pool"][i]["cue"] for i in sel.indices}  # noqa: E731
    runs = {how: [select(CopyOracle(made["pool"], made["labels"], max_node_size=6), depth=None,
                         necessity_pass=False, seed=s, cut=how) for s in range(5)] for how in ("redundancy", "random")}
    assert all(sel.truncations > 0 for sels in runs.values() for sel in sels)
    assert all(len(cues(sel)) == 6 == len(sel.indices) and sel.sufficiency_rate == 1.0 for sel in runs["redundancy"])
    assert any(len(cues(sel)) < 6 for sel in runs["random"])  # a random cut drops cues
    noisy = pool(cues=6, rows=48, noise=0.2, seed=1)
    oracle = CopyOracle(noisy["pool"], noisy["labels"], max_node_size=6)
    sel = select(oracle, depth=2, necessity_pass=False, seed=0, cut="redundancy")
    n = len(noisy["pool"])
    assert sel.truncations > 0 and sel.oracle_calls <= n * 2 + n + sel.truncations * n  # a cut asks each row once
    with pytest.raises(ValueError, match="cut must be"):
        select(oracle, cut="redundant")


@pytest.fixture(scope="module")
def tiny():
    from llmx.core.tokenizer import train_bpe

    tok = train_bpe(E.documents("validation")[:200], 600)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96)
    return LlamaForCausalLM(cfg).eval(), tok


def hand_sum(model, tok, prompt, label):
    head, tail = encode_pair(tok, prompt, label)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([head + tail])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return sum(float(logp[len(head) - 1 + j, t]) for j, t in enumerate(tail))


@pytest.mark.parametrize("labels", [["red", "blue", "gold"], ["red", "blue zork", "quux"]])
def test_label_scores_are_hand_sums_of_token_log_probs(tiny, labels):
    model, tok = tiny
    fmt = E.FORMAT
    prompts = [fmt.prompt([{"input": "bera baz", "label": "red"}] * k, "pom nut") for k in (0, 1, 3)]
    scores = icl.label_scores(model, tok, prompts, labels, batch_size=2)
    multi = any(len(encode_pair(tok, prompts[0], lab)[1]) > 1 for lab in labels)
    assert multi == (labels[1] == "blue zork")  # the second case takes the per-pair path
    for r, p in enumerate(prompts):
        for c, lab in enumerate(labels):
            assert scores[r, c].item() == pytest.approx(hand_sum(model, tok, p, lab), abs=1e-4)


def test_an_lm_oracle_cuts_nodes_to_its_context_and_counts_the_cuts(tiny):
    from llmx.plugins.feeder.oracle import LMOracle

    model, tok = tiny
    fmt = E.FORMAT
    made = E.heldout(E.Spec(cues=24, labels=3), 48, 1, 0)
    oracle = LMOracle(model, tok, fmt, made["pool"], made["labels"], batch_size=8)
    sel = select(oracle, depth=None, seed=0)  # a random model infers little: unions grow past 96 tokens
    assert sel.truncations > 0 and sel.truncated_rows > 0 and sel.budget == oracle.budget
    longest = max(made["pool"], key=lambda r: len(tok(fmt.query(r["input"]))["input_ids"]))["input"]
    for demos, _ in oracle.cache:  # every question asked fits the context with the longest query and label
        prompt = fmt.prompt([made["pool"][d] for d in demos], longest)
        assert max(sum(map(len, encode_pair(tok, prompt, lab))) for lab in made["labels"]) <= 97
    with pytest.raises(UsageError, match="past the model's 96-token context"):
        icl.label_scores(model, tok, [fmt.prompt(made["pool"], longest)], made["labels"])


def test_similar_demos_take_the_nearest_in_pool_order():
    vectors = torch.nn.functional.normalize(torch.tensor([[1.0, 0], [0, 1], [0.9, 0.1], [1, 0]]), dim=-1)
    assert icl.similar_demos(torch.tensor([1.0, 0]), vectors, [10, 11, 12, 13], 2) == [10, 13]
    assert icl.random_demos([5, 1, 9], 8, random.Random(0)) == [1, 5, 9]


def test_episodes_are_redundant_pools_over_single_token_words():
    from llmx.core.tokenizer import train_bpe

    made = E.heldout(E.Spec(cues=32, labels=4, noise=0.05), 400, 50, 7)
    assert {r["cue"] for r in made["pool"]} <= set(made["map"]) and len({r["cue"] for r in made["pool"]}) == 32
    assert all(r["label"] == made["map"][r["cue"]] for r in made["test"])
    noisy = sum(r["label"] != made["map"][r["cue"]] for r in made["pool"])
    assert 5 <= noisy <= 40 and all(r["input"].split()[-1] == r["cue"] for r in made["pool"])
    assert all(r["input"].split().count(r["cue"]) == 1 for r in made["pool"])
    assert E.documents("validation")[:3] == E.documents("validation")[:3]
    assert not set(E.documents("validation")) & set(E.documents("train")[:300])
    tok = train_bpe(E.documents("train")[:400], 768)
    words = E.CUES + E.DISTRACTORS + list(E.LABEL_WORDS)
    assert all(len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1 for w in words)


def test_template_rules():
    fmt = Format("Q: {input} A: {label}", " | ")
    assert fmt.prompt([{"input": "x", "label": "y"}], "z") == "Q: x A: y | Q: z A: "
    for bad in ("no input {label}", "{label} {input}", "{input} {input} {label}"):
        with pytest.raises(UsageError):
            Format(bad)


@pytest.fixture
def episode_data(cli, tmp_path):
    r = cli("--json", "analyze", "--method", "icl-episodes", "--set", "cues=6", "--set", "labels=3", "--set",
            "pool=30", "--set", "test=12", "--set", "distractors=[1, 3]", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    return Path(r.json()["stages"][0]["metrics"]["data_dir"])


def _stage(r, k=0):
    assert r.code == 0, r.err
    return r.json()["stages"][k]["metrics"]


def test_analyze_then_eval_from_the_feeder_set(cli, tmp_path, episode_data):
    pool, test = episode_data / "pool.jsonl", episode_data / "test.jsonl"
    sel = _stage(cli("--json", "analyze", "--method", "feeder", "--model", MODEL, "--data", pool, "--set", "depth=2",
                     "--set", f"template={E.TEMPLATE}", "-o", tmp_path / "runs"))
    record = json.loads(Path(sel["set_file"]).read_text())
    assert 1 <= sel["feeder_rows"] == len(record["indices"]) < 30 and sel["oracle_calls"] > 0
    assert sum(record["per_class"].values()) == sel["feeder_rows"]
    common = ("--model", MODEL, "--data", pool, "--set", f"test={test}", "--set", "shots=3", "--set", "context=128", "--set",
              f"template={E.TEMPLATE}", "--set", f"feeder={sel['set_file']}", "-o", tmp_path / "runs")
    items = []  # each run's test rows' ids: the same whatever pool and selector picked the demonstrations
    for pool_kind in ("feeder", "random"):
        for selector in ("random", "similarity"):
            m = _stage(cli("--json", "eval", "--method", "icl", *common, "--set", f"pool={pool_kind}", "--set",
                           f"selector={selector}"))
            rows = [json.loads(x) for x in Path(m["rows_file"]).read_text().splitlines()]
            items.append([r["item"] for r in rows])
            demos = {d for r in rows for d in r["demos"]}
            assert m["pool_rows"] == sel["feeder_rows"] and len(rows) == m["test_rows"] == 12
            assert all(len(r["demos"]) == min(3, sel["feeder_rows"]) for r in rows)
            if pool_kind == "feeder":
                assert demos <= set(record["indices"])
            else:
                assert len(demos) <= sel["feeder_rows"] and demos != set(record["indices"])
    full = _stage(cli("--json", "eval", "--method", "icl", *common, "--set", "pool=full"))
    assert full["pool_rows"] == 30 and full["demos_per_query"] == 3
    items.append([json.loads(x)["item"] for x in Path(full["rows_file"]).read_text().splitlines()])
    assert all(isinstance(i, str) for i in items[0]) and len(set(items[0])) == 12
    assert all(ids == items[0] for ids in items)
    few = _stage(cli("--json", "eval", "--method", "icl", *common, "--set", "pool=full", "--set", "limit=5"))
    assert [json.loads(x)["item"] for x in Path(few["rows_file"]).read_text().splitlines()] == items[0][:5]


def test_bilevel_training_reselects_each_round(cli, tmp_path, episode_data):
    pool = episode_data / "pool.jsonl"
    m = _stage(cli("--json", "train", "--method", "feeder", "--model", MODEL, "--data", pool, "--set", "depth=1",
                   "--set", "necessity_check=self", "--set", f"template={E.TEMPLATE}", "--set", "outer_rounds=2",
                   "--set", "steps=2", "--set", "batch_size=2", "--set", "shots=2", "--set",
                   f"test={episode_data / 'test.jsonl'}", "--set", "save=false", "-o", tmp_path / "runs"))
    assert len(m["rounds"]) == 2 and all(r["oracle_calls"] > 0 and r["steps"] == 2 for r in m["rounds"])
    assert m["sequence_tokens"] == sum(r["sequence_tokens"] for r in m["rounds"]) > m["label_tokens"] > 0
    assert all(r["sequences"] == 4 for r in m["rounds"])  # steps x batch: none held out of training
    assert all(r["heldout_loss"] > 0 for r in m["rounds"])
    rnd = _stage(cli("--json", "train", "--method", "feeder", "--model", MODEL, "--data", pool, "--set", "pool=random",
                     "--set", "random_size=5", "--set", f"template={E.TEMPLATE}", "--set", "outer_rounds=1",
                     "--set", "steps=2", "--set", "batch_size=2", "--set", "save=false", "-o", tmp_path / "runs"))
    assert rnd["selected_rows"] == 5 and rnd["oracle_calls"] == 0


@pytest.mark.parametrize("sets,words", [
    (['labels=["red", "blue"]'], "is not among the labels"),
    (["template=x {label}"], "exactly one {input}"),
    (["depth=0"], "depth"),
    (['labels=["red", "red"]'], "distinct"),
    (["oracle=copy"], "has no 'cue'"),
])
def test_bad_input_is_exit_2_without_a_run_folder(cli, tmp_path, sets, words):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"input": f"w{i}", "label": lab}) + "\n"
                            for i, lab in enumerate(["red", "blue", "gold"])))
    r = cli("analyze", "--method", "feeder", "--model", MODEL, "--data", pool,
            *[a for s in sets for a in ("--set", s)], "-o", tmp_path / "runs")
    assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) <= 2, r.err
    out = tmp_path / "runs"
    assert not out.exists() or list(out.iterdir()) == []


def test_similarity_embeds_each_row_as_the_model_reads_it(cli, tmp_path, episode_data, monkeypatch):
    """The selector's vectors are of the formatted query (template prefix, the first word's leading space), not of
    the bare input, whose first word the tokenizer splits into pieces the model never saw."""
    from llmx.core.eval import icl

    seen, real = [], icl.embed
    monkeypatch.setattr(icl, "embed", lambda model, tok, texts, batch: seen.extend(texts) or real(model, tok, texts,
                                                                                               batch))
    pool, test = episode_data / "pool.jsonl", episode_data / "test.jsonl"
    _stage(cli("--json", "eval", "--method", "icl", "--model", MODEL, "--data", pool, "--set", f"test={test}", "--set",
               "shots=2", "--set", "selector=similarity", "--set", f"template={E.TEMPLATE}", "-o", tmp_path / "runs"))
    inputs = [json.loads(x)["input"] for f in (pool, test) for x in f.read_text().splitlines()]
    assert seen == [E.FORMAT.query(x) for x in inputs] and all(t.startswith("> ") for t in seen)


def test_a_collapsed_reselection_keeps_the_previous_rounds_set(cli, tmp_path, episode_data, monkeypatch):
    from llmx.plugins.feeder import method

    real, calls = method._choose, []

    def choose(ctx, p, oracle):
        out = real(ctx, p, oracle)
        calls.append(list(out.indices))
        if len(calls) == 2:
            out.indices = out.indices[:1]
        return out

    monkeypatch.setattr(method, "_choose", choose)
    m = _stage(cli("--json", "train", "--method", "feeder", "--model", MODEL, "--data", episode_data / "pool.jsonl",
                   "--set", "depth=1", "--set", "necessity_check=self", "--set", f"template={E.TEMPLATE}",
                   "--set", "outer_rounds=2", "--set",
                   "steps=1", "--set", "batch_size=2", "--set", "shots=2", "--set", "save=false", "-o",
                   tmp_path / "runs"))
    first, second = m["rounds"]
    assert not first["kept_previous_selection"] and second["kept_previous_selection"]
    assert second["selected_rows"] == first["selected_rows"] == len(calls[0]) > 1


def test_a_run_reads_the_episodes_an_earlier_stage_wrote_and_its_rows_average_to_the_accuracy(cli, tmp_path):
    """What ``llmx compare feeder`` runs: episodes (the run's seed picks the map), the FEEDER set and k-shot eval
    with no data named; each test row's ``accuracy`` (the item the comparison pairs) averages to the stage's."""
    import yaml

    pipeline = [{"method": "icl-episodes", "params": {"cues": 6, "labels": 3, "pool": 30, "test": 12}},
                {"method": "feeder", "params": {"depth": 2}},
                {"method": "icl", "params": {"pool": "feeder", "shots": 3, "context": 128}}]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "episodes", "model": MODEL, "seed": 3, "pipeline": pipeline}))
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    episodes, sel, m = (_stage(r, k) for k in range(3))
    assert episodes["map_seed"] == 3
    assert json.loads(Path(sel["set_file"]).read_text())["template"] == E.TEMPLATE  # the episodes' own template
    rows = [json.loads(x) for x in Path(m["rows_file"]).read_text().splitlines()]
    assert len(rows) == m["test_rows"] == 12 and m["demo_pool_rows"] == sel["feeder_rows"]
    assert all(row["accuracy"] == float(row["k_shot"] == row["label"]) for row in rows)
    pool = [json.loads(x) for x in Path(episodes["data_dir"], "pool.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in Path(episodes["data_dir"], "test.jsonl").read_text().splitlines()]
    assert [r["cue_shown"] for r in rows] == ["yes" if t["cue"] in {pool[i]["cue"] for i in r["demos"]} else "no"
                                              for r, t in zip(rows, test, strict=True)]
    assert sum(row["accuracy"] for row in rows) / len(rows) == pytest.approx(m["accuracy"])
    alone = cli("eval", "--method", "icl", "--model", MODEL, "-o", tmp_path / "alone")
    assert alone.code == 2 and "run analyze --method icl-episodes first" in alone.err


def test_a_pool_missing_one_of_the_maps_labels_is_scored_over_the_maps_labels(cli, tmp_path):
    """Seed 1's default pool (12 rows over 6 cues) draws no row of one label that its test rows hold: the later
    stages take the map's labels, not the pool's, so the run scores every test row (it stopped at that label)."""
    import yaml

    made = E.heldout(E.Spec(cues=6, labels=4, distractors=(1, 1)), 12, 200, 1)  # icl-episodes' defaults
    missing = set(made["labels"]) - {r["label"] for r in made["pool"]}
    assert missing and missing <= {r["label"] for r in made["test"]}
    pipeline = [{"method": "icl-episodes", "params": {"test": 8}}, {"method": "icl", "params": {"shots": 3}}]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "labels", "model": MODEL, "seed": 1, "pipeline": pipeline}))
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    episodes, m = (_stage(r, k) for k in range(2))
    assert sorted(episodes["labels"]) == sorted(made["labels"]) and m["test_rows"] == 8


def test_a_default_run_reports_no_cuts_and_pairs_the_set_against_random_subsets(cli, tmp_path):
    import yaml

    pipeline = [{"method": "icl-episodes", "params": {"noise": 0.0}}, {"method": "feeder", "params": {"oracle": "copy"}}]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "copier", "model": MODEL, "seed": 1, "pipeline": pipeline}))
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    episodes, sel = (_stage(r, k) for k in range(2))
    assert episodes["pool_rows"] == 12 and sel["truncations"] == sel["truncated_rows"] == 0
    assert sel["feeder_rows"] == episodes["cues_in_pool"] and sel["sufficiency_rate"] == 1.0  # one row per cue
    vs = sel["versus_random"]
    assert vs["draws"] == 8 and vs["subset_rows"] == sel["feeder_rows"] and vs["losses"] == 0
    assert vs["sufficiency_minus_random"] == pytest.approx(1.0 - vs["random_sufficiency_rate"])
