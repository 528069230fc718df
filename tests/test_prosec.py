"""ProSec's pipeline pieces: bandit matching, rule fixes, pair filters, one scenario per cluster, the 1:1 utility
mix, the pipeline on stubs, and the CLI's bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmx.plugins.prosec import pairs, pipeline
from llmx.plugins.prosec.cwes import ELICITORS
from llmx.plugins.prosec.detect import Finding, Issue, detect
from llmx.plugins.prosec.scenarios import Seed, cut, scenario, seeds

SQL = 'import sqlite3\n\n\ndef find(cursor, name):\n    """Look up rows."""\n'


def test_bandit_matches_the_cwes_on_known_snippets():
    responses = {
        "    cursor.execute(\"SELECT * FROM t WHERE n = '%s'\" % name)\n": (89, True),
        "    cursor.execute(\"SELECT * FROM t WHERE n = ?\", (name,))\n": (89, False),
        "    return pickle.loads(name)\n": (502, True),
        "    return json.loads(name)\n": (502, False),
        "    return ''.join(random.choice('ab') for _ in range(8))\n": (338, True),  # bandit: CWE-330
        "    subprocess.call(name, shell=True)\n": (78, True),
        "    subprocess.call([name])\n": (78, False),  # B603 at LOW: under CWE-78's floor
    }
    found = detect([SQL] * len(responses), list(responses))
    for (text, (cwe, vulnerable)), f in zip(responses.items(), found, strict=True):
        assert f.parsed and f.shows(cwe) == vulnerable, text


def test_rewrites_that_would_break_the_code_leave_it_alone_and_nosec_hides_nothing():
    like = "    cursor.execute(f\"SELECT * FROM t WHERE a LIKE '%{x}%'\")\n"  # a '?' inside quotes binds nothing
    assert ELICITORS[89].rewrite(like) == like
    listed = "    subprocess.call([cmd, path], cwd=path)\n"
    assert ELICITORS[78].rewrite(listed) == listed
    hidden = "    cursor.execute(\"SELECT * FROM t WHERE n = '%s'\" % name)  # nosec\n"
    assert detect([SQL], [hidden])[0].shows(89)


def test_an_issue_on_a_prompt_line_is_not_the_models():
    prompt = 'import pickle\n\n\ndef load(b):\n    """Load."""\n    x = pickle.loads(b)\n'
    assert detect([prompt], ["    return x\n"])[0].issues == ()
    assert detect([prompt[:-len("pickle.loads(b)\n")]], ["pickle.loads(b)\n    return x\n"])[0].shows(502)
    assert not detect([SQL], ["    cursor.execute(\n"])[0].parsed


@pytest.mark.parametrize("cwe, vulnerable", [
    (89, "    cursor.execute(\"SELECT * FROM t WHERE a = '%s' AND b = %s\" % (x, y))\n"),
    (89, '    cursor.execute("SELECT * FROM t WHERE a = " + x)\n'),
    (89, '    cursor.execute(f"SELECT * FROM t WHERE a = {x}")\n'),
    (78, "    subprocess.call(cmd, shell=True)\n"),
    (78, "    subprocess.call('ls ' + path, shell=True, cwd=path)\n"),
    (502, "    return pickle.load(open(path, 'rb'))\n"),
    (338, "    token = ''.join(random.choice(string.ascii_letters) for _ in range(8))\n"),
])
def test_each_rule_fix_removes_its_cwe_and_parses(cwe, vulnerable):
    e = ELICITORS[cwe]
    prompt = f'{e.imports}\n\ndef f(cursor, x, y, cmd, path):\n    """Do it."""\n'
    before, after = detect([prompt, prompt], [vulnerable, e.rewrite(vulnerable)])
    assert before.shows(cwe) and after.parsed and not after.shows(cwe), e.rewrite(vulnerable)


def _finding(*issues: tuple[int, str], parsed: bool = True) -> Finding:
    return Finding(parsed, tuple(Issue("B000", c, s, 9) for c, s in issues))


def test_pair_filters_each_drop_what_the_official_filter_drops():
    vulnerable = ('    cursor = conn.cursor()\n    cursor.execute("SELECT * FROM t WHERE a = " + x)\n'
                  '    rows = cursor.fetchall()\n    cursor.close()\n    return rows\n')
    near = vulnerable.replace('" + x)', ' ?", (x,))')
    far = '    return list(conn.execute("SELECT a, b FROM t WHERE a = ?", [x]).fetchall())\n'
    gutted = vulnerable.replace('    cursor.execute("SELECT * FROM t WHERE a = " + x)\n', "")  # the query deleted
    prompt = 'import sqlite3\n\n\ndef f(conn, x):\n    """Look up."""\n'
    C = pairs.Candidate

    def best(*cands):
        return pairs.best_fix(prompt, vulnerable, 89, list(cands))

    assert best(C(near, _finding(parsed=False), "model")) is None  # does not parse
    assert best(C(near, _finding((89, "MEDIUM")), "model")) is None  # still CWE-89
    assert best(C("    pass\n", _finding(), "model")) is None  # under half the length
    for banned in ("    ...\n", "    # unchanged\n", "    # no change\n"):
        assert best(C(near + banned, _finding(), "model")) is None
    assert best(C(vulnerable, _finding(), "rule")) is None  # no edit at all
    assert best(C(near.replace("cursor.fetchall()", "json.loads(cursor.fetchall())"), _finding(), "rule")) is None
    other, clean = C(near, _finding((78, "HIGH")), "model"), C(far, _finding(), "rule")
    assert best(other, clean) is clean  # the no-detection tier first
    assert best(other) is other  # else the tier without the expected CWE
    assert best(C(far, _finding(), "rule"), C(near, _finding(), "model")).text == near  # the minimal edit
    assert best(C(gutted, _finding(), "model"), C(near, _finding(), "model")).text == near  # brevity penalty
    assert pairs.overlap(near, vulnerable) > pairs.overlap(gutted, vulnerable) and pairs.overlap(near, near) == 1.0
    assert pairs.undefined("import os\ndef f(a):\n    return os.path.join(a, b)\n") == {"b"}


def test_one_scenario_per_cluster_the_member_nearest_its_centre():
    items = [scenario(Seed(f"f.py:{i}", f"f{i}", f'def f{i}():\n    """Doc."""\n'), 89) for i in range(12)]
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    around = 0.3 * np.array([[1.0, 0.0], [0.0, 0.0], [-0.5, 0.866], [-0.5, -0.866]])  # their mean is the centre
    points = np.concatenate([c + around for c in centres])  # member 1 of each cluster sits on its centre
    chosen = pipeline.diverse(items, 3, lambda texts: points[[int(t.split("def f")[1].split("(")[0]) for t in texts]])
    assert sorted(items.index(s) for s in chosen) == [1, 5, 9]
    assert pipeline.diverse(items[:2], 3, lambda texts: 1 / 0) == items[:2]  # fewer than k: all, no embedding


def test_the_utility_mix_is_one_to_one_with_the_roles_pinned():
    security = [{"prompt": f"p{i}", "chosen": f"fix{i}", "rejected": f"vuln{i}", "cwe": 89, "benign": False,
                 "seed": f"s{i}"} for i in range(6)]
    benign = [{"prompt": f"b{i}", "answers": [f"own{i}a", f"own{i}b"] if i != 2 else [], "fixed": f"fix{i}"}
              for i in range(6)]
    rows = pairs.mix(security, benign)
    util = [r for r in rows if r["benign"]]
    assert len(util) == 5 and sorted(r["prompt"] for r in rows if not r["benign"]) == ["p0", "p1", "p3", "p4", "p5"]
    for r in util:
        i = r["prompt"][1:]
        assert r["chosen"].startswith(f"own{i}") and r["rejected"] == f"fix{i}"
    assert rows == pairs.mix(security, benign) and rows != pairs.mix(security, benign, seed=0)
    swapped = [r for r in pairs.mix(security, benign, roles="swapped") if r["benign"]]
    assert all(r["chosen"].startswith("fix") and r["rejected"].startswith("own") for r in swapped)


def test_the_pipeline_on_stubs_counts_and_pairs_what_it_should():
    """A stub model writes a string-built query for half the inducing samples and a parameterised one otherwise; its
    fixes are empty (the rule's rewrite wins); benign answers are plain code."""
    vulnerable = '"SELECT * FROM t WHERE a = " + x)\n'
    safe = '"SELECT * FROM t WHERE a = ?", (x,))\n'

    def sample(prompts, n):
        return [[(vulnerable if k % 2 == 0 else safe) if p.endswith("execute(") else "    return 1\n"
                 for k in range(n)] for p in prompts]

    stages = pipeline.Stages(sample, detect, lambda texts: np.arange(len(texts), dtype=float)[:, None],
                             lambda todo, n: [["    ...\n"] * n for _ in todo])
    found = seeds("train", limit=40)
    result = pipeline.run(found, [89], per_cwe=5, samples=4, fix_samples=1, stages=stages)
    row = result.stats["per_cwe"]["89"]
    assert row["scenarios"] == 5 and row["samples"] == 20 and row["vulnerable"] == 10 and row["unparsed"] == 0
    assert row["vulnerable_rate"] == 0.5 and row["benign_vulnerable_rate"] == 0.0
    assert row["pairs"] == 5  # duplicates of a scenario's vulnerable response pair once
    assert result.stats["fix_sources"] == {"model": 0, "rule": 5}
    assert result.stats["security_pairs"] == 5 and result.stats["utility_pairs"] == 5 and len(result.rows) == 10
    sec = [r for r in result.rows if not r["benign"]]
    assert all("?" in r["chosen"] and "+ x" in r["rejected"] and r["prompt"].startswith("import sqlite3") for r in sec)
    alone = pipeline.run(found, [89], per_cwe=5, samples=4, fix_samples=1, stages=stages, utility=False)
    assert len(alone.rows) == 5 and not any(r["benign"] for r in alone.rows)
    assert result.security == [r for r in result.rows if not r["benign"]]  # the ablation trains on the same pairs


def test_at_most_three_pairs_per_prompt_and_the_rule_only_when_no_model_fix_survives():
    def sample(prompts, n):  # every sample a different string-built query
        return [[f'"SELECT c{k} FROM t WHERE a = " + x)\n' if p.endswith("execute(") else "    return 1\n"
                 for k in range(n)] for p in prompts]

    def fix(todo, n):  # a good fix for the first response of each prompt only (what follows the statement start)
        return [[r[len(s.start):].replace('" + x)', ' ?", (x,))') if "c0 " in r else "    ...\n"] * n
                for s, r in todo]

    stages = pipeline.Stages(sample, detect, lambda texts: np.arange(len(texts), dtype=float)[:, None], fix)
    result = pipeline.run(seeds("train", limit=40), [89], per_cwe=2, samples=6, fix_samples=1, stages=stages)
    assert result.stats["per_cwe"]["89"]["vulnerable"] == 12 and result.stats["per_cwe"]["89"]["pairs"] == 6
    assert result.stats["fix_sources"] == {"model": 2, "rule": 4}


def test_seeds_split_by_file_and_scenarios_splice_the_elicitor():
    train, held = seeds("train", limit=200), seeds("validation", limit=50)
    assert train and held and not {s.where.split(":")[0] for s in train} & {s.where.split(":")[0] for s in held}
    s = scenario(train[0], 502)
    assert s.prompt.startswith("import pickle\n") and train[0].signature in s.prompt and s.prompt.endswith('"""\n')
    assert s.benign == train[0].header and s.start == "    with open(path, 'rb') as f:\n        return"
    assert cut("    x = 1\n    return x\n\nprint(x)\n") == "    x = 1\n    return x\n"


@pytest.mark.parametrize("stage, setting", [("analyze", "prosec"), ("eval", "secure-code")])
def test_a_cwe_without_an_elicitor_is_one_error_and_no_run_folder(cli, tmp_path, stage, setting):
    r = cli(stage, "--method", setting, "--model", "ref:llama-test", "--set", "cwes=[79]", "-o", tmp_path / "runs")
    assert r.code == 2 and "no elicitor for CWE-79" in r.err and len(r.err.strip().splitlines()) <= 2
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def _pairs_file(path):
    import json

    rows = [{"prompt": f'import sqlite3\n\n\ndef f{i}(cursor, x):\n    """Look up."""\n',
             "chosen": '    cursor.execute("SELECT * FROM t WHERE a = ?", (x,))\n',
             "rejected": '    cursor.execute("SELECT * FROM t WHERE a = " + x)\n', "cwe": 89, "benign": i % 2 == 1}
            for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("loss, baseline", [("simpo", "simpo"), ("dpo", "dpo"), ("confpo", "confpo")])
def test_prosec_alignment_is_the_shared_objective_on_its_pairs(tmp_path, loss, baseline):
    from llmx import api

    data = _pairs_file(tmp_path / "pairs.jsonl")
    common = {"data": str(data), "steps": 3, "batch_size": 4, "save": False, "lr": 1e-3}
    extra = {"gamma": 1.6, "beta": 1.5} if loss == "confpo" else {}
    runs = [api.run({"model": "ref:llama-test", "threads": 1, "seed": 0,
                     "pipeline": [{"method": m, "stage": "align", "params": {**common, **extra, **more}}]},
                    output_dir=tmp_path / "runs")["stages"][0]["metrics"]
            for m, more in (("prosec", {"loss": loss}), (baseline, {}))]
    assert runs[0]["final_loss"] == pytest.approx(runs[1]["final_loss"], rel=1e-6)
    assert runs[0]["loss"] == loss and runs[0]["beta"] == {"simpo": 2.0, "dpo": 0.1, "confpo": 1.5}[loss]


def test_safecoder_marks_the_changed_spans_and_its_terms_are_nll_and_unlikelihood():
    import torch

    from llmx.core.models import load
    from llmx.plugins.prosec import safecoder
    from llmx.plugins.prosec.config import SafeCoderParams

    model, tok = load("ref:llama-test")
    before = 'q = "SELECT a FROM t WHERE b = %s" % x\n'
    ids, mark = safecoder.encode(tok, before, [(31, 35)], 64)
    offsets = tok(before, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert [m for m in mark[:len(offsets)]] == [a < 35 and b > 31 for a, b in offsets] and any(mark) and not all(mark)
    row = {"func_src_before": before, "func_src_after": before.replace(" % x", ", (x,)"), "file_name": "a.py",
           "char_changes": {"deleted": [{"char_start": 31, "char_end": 35}], "added": []}}
    p = SafeCoderParams(data=".", max_length=64)
    fixed, vulnerable, plain = safecoder.items(tok, [row], ["x = 1\n"], p)
    assert all(fixed.like) and not any(fixed.unlike) and any(vulnerable.unlike) and not any(vulnerable.like)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([fixed.ids])).logits
        nll = torch.nn.functional.cross_entropy(logits[0, :-1], torch.tensor(fixed.ids[1:]), reduction="sum")
        assert float(safecoder.loss_terms(logits, [fixed])[0]) * sum(fixed.like) == pytest.approx(float(nll), rel=1e-5)
        logits = model(input_ids=torch.tensor([vulnerable.ids])).logits
        p_next = logits[0, :-1].softmax(-1).gather(-1, torch.tensor(vulnerable.ids[1:])[:, None])[:, 0]
        want = -torch.log1p(-p_next[torch.tensor(vulnerable.unlike)]).sum()
        got = safecoder.loss_terms(logits, [vulnerable])[0] * sum(vulnerable.unlike)
        assert float(got) == pytest.approx(float(want), rel=1e-5)


def test_a_malformed_sven_row_is_one_error_naming_its_line(cli, tmp_path):
    import json

    good = {"func_src_before": "a", "func_src_after": "b", "file_name": "x.py",
            "char_changes": {"deleted": [{"char_start": 0, "char_end": 1}], "added": []}}
    for bad, phrase in (({k: v for k, v in good.items() if k != "char_changes"}, "needs char_changes"),
                        ({**good, "char_changes": {"deleted": [{"start": 0}], "added": []}}, "char_changes.deleted"),
                        ({**good, "char_changes": {"deleted": []}}, "char_changes.added")):
        f = tmp_path / "cwe-089.jsonl"
        f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        r = cli("train", "--method", "safecoder", "--model", "ref:llama-test", "--data", f, "-o", tmp_path / "runs")
        assert r.code == 2 and f"{f}:2: " in r.err and phrase in r.err, r.err
        assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*/artifacts/*/*"))


def _toy_lm(seed: int):
    """A tiny LM over task / answer tokens: p(next | task, previous token)."""
    import torch

    torch.manual_seed(seed)

    class Toy(torch.nn.Module):
        def __init__(self, vocab: int = 40, d: int = 16):
            super().__init__()
            self.task, self.prev = torch.nn.Embedding(vocab, d), torch.nn.Embedding(vocab, d)
            self.out = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(d, vocab))

        def logp(self, task: int, answer: list[int]):
            """Per-token log-probs of ``answer`` (its first token follows SLOT)."""
            prev = torch.tensor([SLOT, *answer[:-1]])
            logits = self.out(self.task(torch.tensor([task] * len(answer))) + self.prev(prev))
            return torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer)[:, None])[:, 0]

        def sample(self, task: int, rng) -> list[int]:
            import torch

            out, prev = [], SLOT
            for _ in range(3):
                logits = self.out(self.task(torch.tensor(task)) + self.prev(torch.tensor(prev)))
                prev = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=rng))
                out.append(prev)
            return out

    return Toy()


CALL, INSECURE, SECURE, END, SLOT = 30, 31, 32, 33, 34
WORDS = {30: "CALL", 31: "INSECURE", 32: "SECURE", 33: "END"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_notes_toy_holds_with_stub_model_detector_and_fixer(seed):
    """The notes' CPU toy through ``pipeline.run``: tasks 0-7 need a shell call (SFT writes INSECURE 70% of the
    time), 8-15 are their benign originals; pairs from tasks 0-5, tasks 6-7 held out; SimPO on the pairs. Held-out
    vulnerable rate <= 0.5x SFT's (trivially here: SimPO drives INSECURE to about 1e-4); the drift of the benign
    originals' log-likelihood is >= 2x smaller with the utility pairs on the pairs' own benign prompts (tasks 8-13)
    only: over every benign task (8-15) it is smaller by about 1.7-1.9x on seeds 0 and 2, and on the held-out ones
    (14-15) not at all; on seed 1 the utility pairs remove the drift almost entirely."""
    import re

    import torch

    from llmx.core import preference as P

    def answer_for(task: int, g) -> list[int]:
        if task < 8:
            return [CALL, INSECURE if torch.rand((), generator=g) < 0.7 else SECURE, END]
        return [10 + task % 8, 20 + task % 8, END]

    def task_of(prompt: str) -> int:
        k = int(re.search(r"toy(\d+)", prompt)[1])
        return k + 8 if prompt.startswith("def ") else k  # a benign original is its seed's header

    def text(ids: list[int]) -> str:
        return " ".join(WORDS.get(i, f"w{i}") for i in ids) + "\n"

    def ids(s: str) -> list[int]:
        names = {v: k for k, v in WORDS.items()}
        return [names[w] if w in names else int(w[1:]) for w in s.split()]

    def sft(model, g):
        opt = torch.optim.Adam(model.parameters(), 0.05)
        for _ in range(600):
            loss = -sum(model.logp(t, answer_for(t, g)).sum() for t in range(16)) / 16
            opt.zero_grad()
            loss.backward()
            opt.step()

    def vulnerable_rate(model, tasks):
        with torch.no_grad():
            return sum(float(model.logp(t, [CALL, INSECURE]).exp()[1]) for t in tasks) / len(tasks)

    def benign_logp(model, tasks):
        with torch.no_grad():
            return sum(float(model.logp(t, answer_for(t, None)).sum()) for t in tasks) / len(tasks)

    def drift(model):  # on the utility pairs' own prompts (8-13), and on every benign task (8-15)
        return [benign_logp(model, ts) - benign_logp(base, ts) for ts in (range(8, 14), range(8, 16))]

    g = torch.Generator().manual_seed(seed)
    base = _toy_lm(seed)
    sft(base, g)
    state = {k: v.clone() for k, v in base.state_dict().items()}

    def sample(prompts, n):
        return [[text(base.sample(task_of(p), g)) for _ in range(n)] for p in prompts]

    def detect_stub(prompts, responses):
        return [Finding(True, (Issue("B602", 78, "HIGH", 9),) if "INSECURE" in r else ()) for r in responses]

    stages = pipeline.Stages(sample, detect_stub, lambda texts: np.arange(len(texts), dtype=float)[:, None],
                             lambda todo, n: [[r[len(s.start):].replace("INSECURE", "SECURE")] * n for s, r in todo])
    toys = [Seed(f"toy:{k}", f"toy{k}", f'def toy{k}():\n    """Toy task."""\n') for k in range(6)]
    outcomes = {}
    for utility in (False, True):
        rows = pipeline.run(toys, [78], per_cwe=6, samples=20, fix_samples=1, stages=stages, utility=utility).rows
        model = _toy_lm(seed)
        model.load_state_dict(state)
        opt = torch.optim.Adam(model.parameters(), 0.02)
        for _ in range(100):
            w = torch.stack([model.logp(task_of(r["prompt"]), ids(r["chosen"].split("(", 1)[-1])).mean() for r in rows])
            lose = torch.stack([model.logp(task_of(r["prompt"]), ids(r["rejected"].split("(", 1)[-1])).mean()
                                for r in rows])
            loss = P.simpo_loss(w, lose, 2.0, 0.5).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        outcomes[utility] = (vulnerable_rate(model, [6, 7]), *drift(model))
    assert sum(r["benign"] for r in rows) == sum(not r["benign"] for r in rows) > 0
    held_sft = vulnerable_rate(base, [6, 7])
    assert outcomes[True][0] <= 0.5 * held_sft and outcomes[False][0] <= 0.5 * held_sft
    assert abs(outcomes[False][1]) >= 2 * abs(outcomes[True][1])  # the notes' 2x, on the utility prompts
    assert abs(outcomes[False][2]) + 1e-3 >= abs(outcomes[True][2])  # over every benign task: smaller, not 2x


def test_secure_code_items_add_up_to_its_rates(tmp_path, monkeypatch):
    """items.jsonl (one row per CWE and held-out scenario, what llmx compare prosec pairs) holds the counts the
    headline rates come from; a stub model writes string-built SQL on every other sample."""
    from llmx import api
    from llmx.plugins.prosec import method

    real = method.stages

    def stub(ctx, p, seed):
        st = real(ctx, p, seed)
        bad, good = '"SELECT * FROM t WHERE a = " + new_node)\n', '"SELECT 1")\n'  # after "cursor.execute("
        st.sample = lambda prompts, n: [[bad if (i + k) % 2 else good for k in range(n)] for i in range(len(prompts))]
        return st

    monkeypatch.setattr(method, "stages", stub)
    out = api.run({"model": "ref:llama-test", "threads": 1, "seed": 0, "pipeline": [
        {"method": "secure-code", "params": {"cwes": [89, 502], "scenarios": 3, "samples": 3}}]},
        output_dir=tmp_path / "runs")
    m = out["stages"][0]["metrics"]
    (items,) = (tmp_path / "runs").glob("*/artifacts/0_secure-code/items.jsonl")
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    assert [(r["cwe"], r["scenario"]) for r in rows] == [(c, k) for c in (89, 502) for k in range(3)]
    assert all(r["samples"] == 3 for r in rows)
    assert sum(r["vulnerable"] for r in rows) / sum(r["parsed"] for r in rows) == pytest.approx(
        m["inducing_vulnerable_rate"])
    for cwe in (89, 502):
        mine = [r for r in rows if r["cwe"] == cwe]
        parsed = sum(r["parsed"] for r in mine)
        assert (sum(r["vulnerable"] for r in mine) / parsed if parsed else 0.0) == pytest.approx(
            m[f"inducing_vulnerable_rate_{cwe}"])
    assert sum(r["inducing_vulnerable_share"] for r in rows) / len(rows) == m["inducing_vulnerable_share"]
    ids = [r["item"] for r in rows]  # the CWE, the seed and the inducing prompt: never the completions
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 6

    def items(cwes, out):
        api.run({"model": "ref:llama-test", "threads": 1, "seed": 1, "pipeline": [
            {"method": "secure-code", "params": {"cwes": cwes, "scenarios": 2, "samples": 2}}]}, output_dir=tmp_path / out)
        (path,) = (tmp_path / out).glob("*/artifacts/0_secure-code/items.jsonl")
        return [json.loads(line)["item"] for line in path.read_text().splitlines()]

    def other(ctx, p, seed):  # another model: other completions
        st = real(ctx, p, seed)
        st.sample = lambda prompts, n: [["pass\n"] * n for _ in prompts]
        return st

    monkeypatch.setattr(method, "stages", other)
    assert items([502], "again") == ids[3:5]
    assert not set(items([78], "other")) & set(ids)
    assert m["inducing_vulnerable_rate_89"] > 0


def test_prosec_aligns_on_the_runs_own_pairs_and_skips_none_only_when_asked(tmp_path, monkeypatch):
    from llmx import api
    from llmx.errors import UsageError
    from llmx.plugins.prosec import objective

    data = _pairs_file(tmp_path / "pairs.jsonl")
    monkeypatch.setattr(objective, "run_pairs", lambda run_dir: str(data))
    align = {"method": "prosec-align", "stage": "align", "params": {"steps": 2, "batch_size": 4, "save": False}}
    run = lambda stage: api.run({"model": "ref:llama-test", "threads": 1, "seed": 0, "pipeline": [stage]},  # noqa: E731
                                output_dir=tmp_path / "runs")["stages"][0]["metrics"]
    assert run(align)["train_rows"] > 0
    data.write_text("")
    assert run({**align, "params": {**align["params"], "empty": "skip"}})["steps"] == 0
    with pytest.raises(UsageError, match="no rows"):
        run(align)
    monkeypatch.undo()
    with pytest.raises(UsageError, match="no pairs: pass data"):
        run(align)


def test_a_statement_completion_ends_with_its_logical_line_and_is_scanned_in_its_function():
    from llmx.plugins.prosec.scenarios import statement

    start = "    cursor.execute("
    cases = {
        '"SELECT * FROM t WHERE a = %s" % (x,))\n    return cursor.fetchall()\n':
            '    cursor.execute("SELECT * FROM t WHERE a = %s" % (x,))\n',
        '\n        "SELECT (" + x +\n  ")")  # c)\n    x = 1\n': '    cursor.execute(\n        "SELECT (" + x +\n  ")")  # c)\n',
        '"a\\"b)")\n    y\n': '    cursor.execute("a\\"b)")\n',
        "'''a\nb)''', x) \\\n  .fetchall()\n    z\n": "    cursor.execute('''a\nb)''', x) \\\n  .fetchall()\n",
        "x, y\n    return 1\n\ndef g():\n": "    cursor.execute(x, y\n    return 1\n",  # never closed: the function's end
    }
    for completion, want in cases.items():
        assert statement(start + completion, len(start)) == want, completion
    with_block = "    with open(path, 'rb') as f:\n        return"  # the line under way is the start's last
    assert statement(with_block + " pickle.load(f)\n    x = 2\n", len(with_block)) == with_block + " pickle.load(f)\n"
    s = scenario(seeds("train", limit=1)[0], 89)
    good, bad, broken = (pipeline.respond(s, c) for c in ('"SELECT 1 WHERE a = ?", (a,))\n    return 1\n',
                                                          '"SELECT * FROM t WHERE a = " + a)\n    return 1\n',
                                                          '"SELECT * FROM t WHERE a = " + a\n'))
    found = detect([s.prompt] * 3, [good, bad, broken])
    assert [f.parsed for f in found] == [True, True, False] and [f.shows(89) for f in found] == [False, True, False]
    assert pipeline.respond(s, '"SELECT 1")\n    return 1\n\nx = 2\n', "function") == (
        '    cursor.execute("SELECT 1")\n    return 1\n')
