"""Tasks: the registry and its CLI, the shared helpers (generation with stop strings, continuation scoring,
statistics, answers) against hand computations, the judges, HumanEval, lm-eval, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from llmx.core.eval import answers, stats
from llmx.core.eval.generate import generate
from llmx.core.eval.score import continuation_logprobs, encode_pair

PLUGIN = '''
from llmx.core.spec import TaskSpec
from llmx.hookspecs import hookimpl


def rows(split, seed):
    return [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(4)]


def judge(row, completion):
    return completion.strip() == row["answer"]


def crash(row, completion):
    if row["prompt"].startswith(("1", "3")):
        raise RuntimeError("the judge broke")
    return 0.5


@hookimpl
def llmx_tasks():
    yield TaskSpec("sums", "sums_plugin:rows", "sums_plugin:judge", splits=("test",), stop=("\\n",), max_new_tokens=4,
                   summary="Add a number to itself.")
    yield TaskSpec("crashy", "sums_plugin:rows", "sums_plugin:crash", splits=("test",), max_new_tokens=2)
'''


@pytest.fixture
def plugin_dir(tmp_path):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "sums_plugin.py").write_text(PLUGIN)
    return folder


@pytest.fixture(scope="module")
def ref():
    from llmx.core import models

    return models.load("ref:llama-test", dtype="float32", device="cpu")


def stage(r):
    assert r.code == 0, r.err
    return r.json()["stages"][-1]["metrics"]


def test_a_third_party_task_is_listed_and_runs(cli, plugin_dir, tmp_path):
    listed = cli("--json", "--plugins-dir", plugin_dir, "tasks").json()
    assert {"sums", "crashy", "brackets", "humaneval"} <= {t["name"] for t in listed}
    m = stage(cli("--json", "--plugins-dir", plugin_dir, "eval", "--method", "task", "--model", "tiny:llama",
                  "--set", "task=sums", "-o", tmp_path / "runs"))
    assert m["task"] == "sums" and m["prompts"] == 4 and m["completions"] == 4 and 0 <= m["score"] <= 1


def test_a_judge_that_raises_is_reported_per_row_and_the_run_goes_on(cli, plugin_dir, tmp_path):
    r = cli("--json", "--plugins-dir", plugin_dir, "eval", "--method", "task", "--model", "tiny:llama",
            "--set", "task=crashy", "-o", tmp_path / "runs")
    m = stage(r)
    assert m["judge_errors"] == 2 and m["score"] == pytest.approx(0.25)  # two rows score 0.5, two count 0
    records = [json.loads(line) for line in Path(r.json()["run_dir"], "artifacts", "0_task", "rows.jsonl").open()]
    assert [rec["errors"][0] is not None for rec in records] == [False, True, False, True]
    assert "RuntimeError: the judge broke" in records[1]["errors"][0]


def test_unknown_task_has_a_did_you_mean_and_exit_2(cli):
    r = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=humanevl")
    assert r.code == 2 and "Did you mean 'humaneval'" in r.err
    r = cli("tasks", "show", "bracket")
    assert r.code == 2 and "Did you mean 'brackets'" in r.err


def test_bad_task_params_are_config_errors(cli):
    greedy = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=brackets",
                 "--set", "temperature=0", "--set", "samples=3")
    assert greedy.code == 2 and "greedy" in greedy.err
    kl = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=brackets", "--set", "kl=true",
             "--set", "temperature=0.7")
    assert kl.code == 2 and "temperature 1" in kl.err
    both = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=brackets", "--set", "file=x.jsonl")
    assert both.code == 2 and "exactly one" in both.err
    split = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=brackets", "--set", "split=test")
    assert split.code == 2 and "no split 'test'" in split.err
    k = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", "task=brackets", "--set", "k=[1,8]")
    assert k.code == 2 and "pass@8 needs at least 8 samples" in k.err
    typo = cli("quantize", "--method", "rtn", "--model", "tiny:llama", "--eval", "humaneva")
    assert typo.code == 2 and "Did you mean 'humaneval'" in typo.err


def test_kl_from_a_reference_with_another_tokenizer(cli, tmp_path):
    """Each model scores the sampled text with its own tokenizer: KL from itself is 0, from a random byte-level
    model it is large and positive."""
    runs = []
    for reference in ("ref:llama-test", "tiny:llama"):
        runs.append(stage(cli("--json", "eval", "--method", "task", "--model", "ref:llama-test", "--set", "task=brackets",
                              "--set", "limit=6", "--set", f"kl_reference={reference}", "-o", tmp_path)))
    assert runs[0]["kl_from_reference"] == pytest.approx(0.0, abs=1e-4) and runs[0]["kl_level"] == "tokens"
    assert runs[1]["kl_from_reference"] > 1.0 and runs[1]["kl_per_token"] > 0.5 and runs[1]["kl_level"] == "text"
    assert runs[1]["kl_ci_low"] <= runs[1]["kl_from_reference"] <= runs[1]["kl_ci_high"]


def test_the_kl_estimate_scores_the_tokens_as_sampled(ref):
    """Token level: the log-ratio of the very tokens drawn (the stop string's whole token, not a re-encoding of the
    cut text), against a hand forward pass; a sampled EOS is among them."""
    from llmx.core import models
    from llmx.core.eval.tasks import drift

    model, tok = ref
    other, _ = models.load("ref:llama-test", dtype="float32", device="cpu")
    with torch.no_grad():
        other.lm_head.weight.mul_(1.3)  # another policy, same vocabulary
    rows = [{"prompt": "def f(x):\n    return"}, {"prompt": "x = compute("}]
    completions = generate(model, tok, [r["prompt"] for r in rows], max_new_tokens=12, samples=3, temperature=1.0,
                           stop=["\n"], include_stop=True, seed=3)
    _, per_prompt = drift(model, tok, other, tok, rows, completions, 4, lambda x, **_: x)
    for row, cs, value in zip(rows, completions, per_prompt, strict=True):
        hand = []
        for c in cs:
            ids = tok(row["prompt"])["input_ids"] + list(c.ids)
            x = torch.tensor([ids])
            with torch.no_grad():
                a, b = (torch.log_softmax(m(input_ids=x).logits[0, :-1].float(), -1) for m in (model, other))
            start = len(ids) - len(c.ids) - 1
            hand.append(sum(float(a[start + k, t] - b[start + k, t]) for k, t in enumerate(c.ids)))
            assert tok.decode(list(c.ids), skip_special_tokens=True).startswith(c.text)
        assert value == pytest.approx(sum(hand) / len(hand), abs=1e-3)


def test_eval_flag_names_a_task(cli):
    r = cli("--json", "--dry-run", "quantize", "--method", "rtn", "--model", "tiny:llama", "--eval", "brackets",
            "--eval", "perplexity")
    pipeline = r.json()["config"]["pipeline"]
    assert [s["method"] for s in pipeline] == ["task", "perplexity", "rtn", "task", "perplexity"]  # before and after
    assert pipeline[3]["params"]["task"] == "brackets" and pipeline[0] == pipeline[3]


def hand_greedy(model, tok, prompt: str, max_new: int, stops: list[str], include: bool) -> str:
    """Greedy decoding without a cache, one token at a time, cut at the earliest stop string."""
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            if any(s in tok.decode(new, skip_special_tokens=True) for s in stops):
                break
    text = tok.decode(new, skip_special_tokens=True)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text
    at, s = min(hits)
    return text[:at + (len(s) if include else 0)]


@pytest.mark.parametrize("name,include", [("ref:llama-test", False), ("ref:llama-test", True), ("tiny:mamba", False)])
def test_batched_greedy_decoding_with_stop_strings_equals_a_hand_loop(name, include, ref):
    from llmx.core import models

    model, tok = ref if name == "ref:llama-test" else models.load(name, dtype="float32", device="cpu")
    prompts = ["def f(x):\n    return", "import os\n", "x = compute(", "class A:\n    def __init__(self", "for",
               "if x:\n    "]
    stops = ["N", "self"]
    out = generate(model, tok, prompts, max_new_tokens=16, stop=stops, include_stop=include, batch_size=4)
    assert [c[0].text for c in out] == [hand_greedy(model, tok, p, 16, stops, include) for p in prompts]
    if name == "ref:llama-test":  # each ending occurs, so the comparison covers them all
        assert {c[0].stop for c in out} == {"N", "self", None}


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens():
    from llmx.core import models
    from llmx.errors import UsageError

    model, tok = models.load("tiny:gpt2", dtype="float32", device="cpu")
    model.config.n_positions = 40  # its context, as the config says
    long = "x = 1\n" * 20  # 120 byte tokens
    (cut,), = generate(model, tok, [long], max_new_tokens=8)
    (same,), = generate(model, tok, [long[-32:]], max_new_tokens=8)
    assert cut.truncated and not same.truncated and cut.text == same.text
    with pytest.raises(UsageError, match="no room"):
        generate(model, tok, ["x"], max_new_tokens=40)


def test_sampling_is_seeded_per_completion_not_per_batch(ref):
    model, tok = ref
    prompts = ["def ", "import", "x = (", "class "]
    a = generate(model, tok, prompts, max_new_tokens=10, samples=3, temperature=1.0, seed=7, batch_size=5)
    b = generate(model, tok, prompts, max_new_tokens=10, samples=3, temperature=1.0, seed=7, batch_size=1)
    c = generate(model, tok, prompts, max_new_tokens=10, samples=3, temperature=1.0, seed=8, batch_size=5)
    texts = [[x.text for x in row] for row in a]
    assert texts == [[x.text for x in row] for row in b] and texts != [[x.text for x in row] for row in c]
    assert len({t for row in texts for t in row}) > 4  # samples differ from each other


def test_label_word_scoring_equals_a_hand_sum_of_token_log_probs(ref):
    model, tok = ref
    pairs = [("def f(x):\n    return", " x + 1"), ("The value is ", "True"), ("import", " os\n"), ("", "pass")]
    scored = continuation_logprobs(model, tok, pairs, batch_size=3)
    for (context, continuation), s in zip(pairs, scored, strict=True):
        head, tail = encode_pair(tok, context, continuation)
        ids = torch.tensor([head + tail])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        hand = sum(float(logp[len(head) + k - 1, t]) for k, t in enumerate(tail))
        assert s.tokens == len(tail) > 0 and s.logprob == pytest.approx(hand, abs=1e-4)
    assert encode_pair(tok, "The value is ", "True")[1] == tok("The value is True")["input_ids"][
        len(tok("The value is")["input_ids"]):]  # the trailing space moved to the continuation


def test_bootstrap_interval_of_a_known_sample():
    assert stats.bootstrap_ci([0.5] * 40) == (0.5, 0.5)
    coin = [0.0] * 200 + [1.0] * 200  # mean 0.5, standard error 0.025
    low, high = stats.bootstrap_ci(coin, resamples=2000, seed=3)
    assert low < 0.5 < high and high - low == pytest.approx(2 * 1.96 * 0.025, rel=0.15)
    assert stats.bootstrap_ci(coin, seed=3) == stats.bootstrap_ci(coin, seed=3)
    assert all(math.isnan(v) for v in stats.bootstrap_ci([]))


def test_pass_at_k_and_paired_comparison():
    assert stats.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert stats.pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert stats.pass_at_k(5, 0, 3) == 0.0 and stats.pass_at_k(5, 3, 3) == 1.0
    with pytest.raises(ValueError):
        stats.pass_at_k(3, 1, 4)
    p = stats.paired([0, 0, 1, 1], [1, 0, 1, 0])
    assert (p.diff, p.wins, p.losses, p.ties) == (0.0, 1, 1, 2)
    same = stats.paired([0.2, 0.4], [0.2, 0.4])
    assert (same.low, same.high) == (0.0, 0.0)


def test_answer_extraction_and_exact_match():
    assert answers.extract("  \n42 is it\nmore") == "42 is it"
    assert answers.extract("so the answer is 7. Final: 9", r"(\d+)") == "9"
    assert answers.extract("nothing", r"answer: (\w+)") == ""
    assert answers.exact_match(" Paris. ", "paris") and answers.exact_match("3.0", "3")
    assert not answers.exact_match("3", "4") and not answers.exact_match("Lyon", "Paris")


def test_training_rows_from_judged_samples():
    from llmx.plugins.tasks.method import training_rows

    records = [{"prompt": "a", "completions": ["x", "y", ""], "scores": [0.0, 1.0, 0.0], "errors": [None] * 3},
               {"prompt": "b", "completions": ["z", "w"], "scores": [1.0, 0.0], "errors": [None, "boom"]}]
    data = training_rows([{"prompt": "a", "reference": "ref"}, {"prompt": "b"}], records)
    assert data["paired"] == [{"prompt": "a", "chosen": "y", "rejected": "x"}]  # b's failing sample is an error
    assert [r["label"] for r in data["unpaired"]] == [False, True, True]  # the empty completion is left out
    assert data["chosen"] == [{"prompt": "a", "completion": "y"}, {"prompt": "b", "completion": "z"}]
    assert data["sft"] == [{"prompt": "a", "completion": "ref"}]


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    from concurrent.futures import ThreadPoolExecutor

    from llmx.plugins.tasks import humaneval

    problems = humaneval.rows("test", 0)
    assert len(problems) == 164
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda p: humaneval.judge(p, p["reference"]), problems))
    assert [p["id"] for p, (ok, _) in zip(problems, verdicts, strict=True) if not ok] == []
    wrong = humaneval.judge(problems[0], "    return None\n")
    assert not wrong[0] and wrong[1].startswith("failed")


def test_humaneval_eval_reports_pass_at_1_and_reference_nll(cli, tmp_path):
    r = cli("--json", "eval", "--method", "task", "--model", "ref:llama-test", "--set", "task=humaneval",
            "--set", "limit=3", "--set", "max_new_tokens=16", "-o", tmp_path)
    m = stage(r)
    assert m["prompts"] == 3 and m["pass@1"] == 0.0 and m["judge_errors"] == 0
    assert 0.5 < m["reference_bpb"] < 8 and m["reference_nll_per_token"] > 0
    records = [json.loads(x) for x in Path(r.json()["run_dir"], "artifacts", "0_task", "rows.jsonl").open()]
    assert [rec["id"] for rec in records] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(rec["notes"][0].split(":")[0] in ("failed", "raised", "exited", "timeout", "cpu") for rec in records)


def test_a_code_task_is_refused_before_generation_where_code_cannot_be_confined(cli, tmp_path, monkeypatch):
    from llmx.core.eval import sandbox

    monkeypatch.setattr(sandbox, "NAMESPACES", ("user", "time_travel"))  # a kernel without what the sandbox needs
    sandbox._cannot_confine.cache_clear()
    args = ("eval", "--method", "task", "--model", "ref:llama-test", "--set", "task=humaneval", "--set", "limit=2",
            "--set", "max_new_tokens=8")
    r = cli(*args, "-o", tmp_path / "refused")
    sandbox._cannot_confine.cache_clear()
    assert r.code == 3 and "cannot confine" in r.err and "unsafe_unconfined=true" in r.err, r.err
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    ok = cli("--json", *args, "--set", "unsafe_unconfined=true", "-o", tmp_path / "unsafe")
    assert ok.code == 0 and stage(ok)["prompts"] == 2


CHOICE_ROWS = [
    {"prompt": "import os\nprint(os.path.", "choices": ["join(a, b))", "%%%", "exists(p))"], "answer": 0},
    {"prompt": "def add(a, b):\n    return", "choices": ["a + b", "}}}", "a - b"], "answer": 0},
    {"prompt": "for i in", "choices": ["@@", "range(10):", "x"], "answer": 1},
    {"prompt": "class Point:\n    def", "choices": ["__init__(self, x, y):", "))))"], "answer": 0},
    {"prompt": "if x ==", "choices": ["None:", "0:", "]]"], "answer": 1},
    {"prompt": "    return self.", "choices": ["value", "\n\n\n", "_x"], "answer": 2},
    {"prompt": "from typing import", "choices": ["List", "42", "(("], "answer": 0},
    {"prompt": "x = [1, 2,", "choices": [" 3]", "'a'", "def"], "answer": 0},
    {"prompt": "def main():\n    ", "choices": ["return 0", "}}}"], "answer": 0},  # trailing whitespace moves
    {"prompt": "import sys\n", "choices": ["import os", "@@@"], "answer": 0},
    {"prompt": "", "choices": ["import os", "]]]"], "answer": 0},  # an empty context is BOS / EOS
]


def write_rows(folder: Path) -> Path:
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHOICE_ROWS))
    return path


@pytest.mark.slow
def test_lm_eval_on_a_local_task_agrees_with_llmx_row_by_row(cli, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = write_rows(tmp_path)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_mc.yaml").write_text(
        f"task: local_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {rows}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{prompt}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    theirs = cli("--json", "eval", "--method", "lm-eval", "--model", "ref:llama-test", "--set", "tasks=local_mc",
                 "--set", f"include_path={tmp_path / 'tasks'}", "-o", tmp_path / "runs")
    ours = cli("--json", "eval", "--method", "task", "--model", "ref:llama-test", "--set", f"file={rows}",
               "-o", tmp_path / "runs")
    a, b = stage(theirs), stage(ours)
    assert a["local_mc.acc"] == b["accuracy"] and a["local_mc.acc_norm"] == b["accuracy_norm"]
    samples = [json.loads(x) for x in Path(theirs.json()["run_dir"], "artifacts", "0_lm-eval",
                                           "samples_local_mc.jsonl").open()]
    mine = [json.loads(x) for x in Path(ours.json()["run_dir"], "artifacts", "0_task", "rows.jsonl").open()]
    samples.sort(key=lambda s: s["doc_id"])
    assert [bool(s["acc"]) for s in samples] == [r["correct"] for r in mine]
    for s, r in zip(samples, mine, strict=True):  # the log-likelihoods themselves, choice by choice
        assert [resp[0][0] for resp in s["resps"]] == pytest.approx(r["logprobs"], abs=1e-4)
    assert 0 < b["accuracy"] < 1  # some right and some wrong: the agreement is not vacuous
    unknown = cli("eval", "--method", "lm-eval", "--model", "tiny:llama", "--set", "tasks=local_mcq",
                  "--set", f"include_path={tmp_path / 'tasks'}", "-o", tmp_path / "runs")
    assert unknown.code == 2 and "Did you mean 'local_mc'" in unknown.err


def test_lm_eval_missing_is_exit_3_with_the_install_hint(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    r = cli("eval", "--method", "lm-eval", "--model", "tiny:llama", "--set", "tasks=hellaswag")
    assert r.code == 3 and "pip install -e '.[lm-eval]'" in r.err


def test_file_tasks_check_their_rows(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "choices": ["a", "b"], "answer": 0}) + "\n"
                   + json.dumps({"prompt": "q", "choices": ["a", "b"], "answer": 5}) + "\n")
    r = cli("eval", "--method", "task", "--model", "tiny:llama", "--set", f"file={bad}", "-o", tmp_path / "runs")
    assert r.code == 2 and "bad.jsonl:2" in r.err and "answer" in r.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("*/artifacts/*/rows.jsonl"))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": f"Q{i}: 2+{i}=", "answer": str(2 + i)}) + "\n" for i in range(3)))
    m = stage(cli("--json", "eval", "--method", "task", "--model", "tiny:llama", "--set", f"file={qa}",
                  "--set", r"answer_pattern=(\d+)", "-o", tmp_path / "runs"))
    assert m["task"] == "file:qa.jsonl" and m["prompts"] == 3 and m["score"] in (0.0, 1 / 3, 2 / 3, 1.0)


def test_analyze_writes_training_rows_that_the_align_stage_reads(cli, tmp_path):
    r = cli("--json", "analyze", "--method", "task", "--model", "ref:llama-test", "--set", "task=brackets",
            "--set", "limit=6", "--set", "splits=[\"train\"]", "-o", tmp_path / "runs")
    m = stage(r)
    folder = Path(m["data_dir"])
    assert {p.name for p in folder.glob("*.jsonl")} == {f"train_{k}.jsonl" for k in ("paired", "unpaired", "chosen",
                                                                                      "sft")}
    assert m["train_unpaired"] == len(folder.joinpath("train_unpaired.jsonl").read_text().splitlines()) > 0
    aligned = cli("--json", "align", "--method", "kto", "--model", "ref:llama-test", "--data",
                  folder / "train_unpaired.jsonl", "--set", "steps=1", "--set", "batch_size=2", "--set", "save=false",
                  "-o", tmp_path / "runs")
    assert aligned.code == 0, aligned.err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_generation_scoring_and_task_eval_on_cuda_match_the_cpu(cli, tmp_path):
    from llmx.core import models

    cpu = models.load("ref:llama-test", dtype="float32", device="cpu")
    gpu = models.load("ref:llama-test", dtype="float32", device="cuda")
    prompts = ["def f(x):\n    return", "import os\n", "x = compute("]
    a = generate(*cpu, prompts, max_new_tokens=12, stop=["O"], batch_size=2)
    b = generate(*gpu, prompts, max_new_tokens=12, stop=["O"], batch_size=2)
    assert [c[0].text for c in a] == [c[0].text for c in b]
    sampled = generate(*gpu, prompts, max_new_tokens=8, samples=2, temperature=1.0, seed=1)
    assert all(len(row) == 2 for row in sampled)
    pairs = [("def f(x):\n    return", " x"), ("import", " os")]
    for x, y in zip(continuation_logprobs(*cpu, pairs), continuation_logprobs(*gpu, pairs), strict=True):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-3)
    r = cli("--json", "eval", "--method", "task", "--model", "ref:llama-test", "--device", "cuda", "--set",
            "task=brackets", "--set", "limit=4", "--set", "kl=true", "--set", "compare=tiny:llama", "-o", tmp_path)
    assert r.code == 0, r.err


def test_the_kl_frontier_of_a_binary_reward():
    p = [0.1, 0.5, 0.9]
    assert stats.frontier_rate(p, 0.0) == pytest.approx(0.5)
    rates = [stats.frontier_rate(p, k) for k in (0.05, 0.2, 0.5, 1.0)]
    assert rates == sorted(rates) and rates[-1] < 1.0  # more KL buys more, never everything
    one = stats.frontier_rate([0.2], 0.3)  # a single prompt: the q whose binary KL from p is the budget
    assert stats.binary_kl(one, 0.2) == pytest.approx(0.3, abs=1e-6)
    assert stats.frontier_kl(p, stats.frontier_rate(p, 0.2)) == pytest.approx(0.2, rel=1e-4)
    assert stats.frontier_kl(p, 0.4) == 0.0 and stats.tilted(0.3, 800.0) == 1.0  # no overflow at large strengths
    # no policy at the same KL does better: a mixture that spends the budget unevenly is below the frontier
    uneven = (stats.tilted(0.1, 3.0) + 0.5 + 0.9) / 3
    spent = stats.binary_kl(stats.tilted(0.1, 3.0), 0.1) / 3
    assert uneven < stats.frontier_rate(p, spent)


def test_a_tokenizer_whose_pad_is_its_eos_does_not_add_unsampled_eos_tokens(ref):
    """Rows that a stop string ended are padded with the EOS while the batch goes on: that EOS was not sampled."""
    import copy

    model, tok = ref
    tok = copy.deepcopy(tok)
    tok.pad_token = tok.eos_token
    prompts = ["def f(x):\n    return", "import os\n", "x = compute(", "for"]
    out = generate(model, tok, prompts, max_new_tokens=12, samples=3, temperature=1.0, stop=["\n"], include_stop=True,
                   seed=1, batch_size=12)
    stopped = [c for cs in out for c in cs if c.stop == "\n"]
    assert stopped and all(c.ids[-1] != tok.eos_token_id for c in stopped)


def test_every_row_carries_the_item_it_asked(cli, tmp_path):
    """``rows.jsonl``'s ``item`` digests the task, the row's id and prompt (and choices): the same under another
    model, another for another split's rows."""

    def items(model, *sets):
        r = cli("--json", "eval", "--method", "tracing", "--model", model, "--set", "limit=3", "--set",
                "max_new_tokens=2", *[a for s in sets for a in ("--set", s)], "-o", tmp_path / model.replace(":", "-"))
        stage(r)
        records = [json.loads(x) for x in Path(r.json()["run_dir"], "artifacts", "0_tracing", "rows.jsonl").open()]
        ids = [rec["item"] for rec in records]
        assert all(isinstance(i, str) for i in ids) and len(set(ids)) == len(records) == 3
        return ids

    test = items("tiny:llama", "split=test")
    assert items("tiny:gpt2", "split=test") == test
    assert not set(items("tiny:opt", "split=validation")) & set(test)
    r = cli("--json", "eval", "--method", "task", "--model", "tiny:llama", "--set", f"file={write_rows(tmp_path)}",
            "-o", tmp_path / "choice")
    stage(r)
    records = [json.loads(x) for x in Path(r.json()["run_dir"], "artifacts", "0_task", "rows.jsonl").open()]
    assert len({rec["item"] for rec in records}) == len(CHOICE_ROWS)
