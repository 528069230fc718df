"""FEEDER against the full pool and a random subset of its size, on a Llama that learns in context; and, with no
trained model, the tree's cuts at the plugin's default episode pool and the exact copier's verdict on it.

    python benchmarks/bench_feeder.py [--seeds 0 1 2] [--workers 2] [--fewshot ../shared/data/fewshot]
                                      [--cut random|redundancy] [--only model cuts copy] [--maps 10]

Sections (``--only``; all by default): ``model`` is parts 1-4 below (they need ``ref:llama-icl``); ``cuts`` and
``copy`` need no trained model and take seconds (feeder_defaults.json and .md):

- cuts: per held-out map, icl-episodes' default pool (``plugin.EPISODES``) under ref:llama-icl's tokenizer (trained
  as the zoo trains it) and 64-token context: the pool's demonstration tokens against the budget one question leaves,
  and the tree's cuts (``truncations``) at ``analyze --method feeder``'s defaults with two oracles, a random-weight
  Llama of ref:llama-icl's shape (nothing is inferred, so unions grow as large as they can) and the exact copier asked
  only what fits the same budget. As a labelled contrast, the old 400-row pool (1-3 distractors) of the ``--seeds``
  maps under the same two oracles, beside the cuts feeder.json recorded with the trained model.
- copy: per held-out map, at noise 0 and at the default noise, ``oracle: copy`` at the feeder defaults: the set holds
  exactly one row of each cue in the pool; it infers as many pool rows as any set can (under a copier a cue's rows
  are inferred by its one row, so the best is the sum over cues of the cue's most common label); removing any member,
  a cue's only row, fails exactly the rows of that cue the set inferred and no other; and the set against
  ``random_draws`` random subsets of its size, paired per pool row. Pass and fail counts over maps and removals.

1. The episode model: ``llmx zoo build llama --preset icl`` (``ref:llama-icl``: a 2-layer Llama, 40k steps of 8x64
   tokens of ``icl-episodes`` with no early stopping, built once and cached by the zoo). First the check that it
   learns in context: 0-shot and 8-shot (and 4-shot) accuracy, random demonstrations from a 400-row pool, on held-out
   maps of 4, 6 and 8 cues.
2. Per seed (a held-out 6-cue, 4-label map of 400 noisy pool rows and 200 clean test rows, and the tree's seed):
   ``analyze --method feeder`` (the tree to one node, the necessity pass checking the whole pool, the notes'
   wording): set size, oracle calls, pool-sufficiency rate; ``eval --method icl`` at 4 and 8 shots for selector
   random / similarity from the full pool, the FEEDER set and a random subset of its size.
3. Fine-tuning at one budget (64 steps of 8 in-context sequences, 4 shots each, lr 3e-4, full weights): the full
   pool, the FEEDER set (one selection; bi-level: 2 outer rounds of 32 steps), a random subset of the FEEDER set's
   size; then 0-shot and 8-shot (full pool, random) accuracy on the test rows, with tokens trained.
4. With ``--fewshot``: SST-2 and TREC (github tonyzhaozh/few-shot-learning): a MetaICL-style episode model trained on
   their training rows, the class -> label-word map drawn afresh per episode; 0-shot vs 8-shot on their test rows
   under a fixed held-out map first, FEEDER only if that shows in-context learning.

Finished runs are kept in ``--work`` under their spec's digest, so an interrupted run resumes. Writes
benchmarks/results/feeder.json and .md (``--cut redundancy``: feeder_cut_redundancy.json and .md); the model-free
sections write feeder_defaults.json and .md.

Not a comparison: ``llmx compare feeder`` runs the 8-shot random-selector arms of part 2 (FEEDER set, random subset
of its size, full pool) paired per test row; this script adds the in-context-learning check over several maps, the
similarity selector, the fine-tuning of part 3 and the natural-data part 4."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cached, child, machine, markdown, spread, verdict, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EPISODE_MODEL = {"arch": "llama", "preset": "icl"}  # ref:llama-icl: the icl-episodes corpus
NATURAL_MODEL = {"arch": "llama", "preset": "bench", "text_split": "blocks", "hidden": 128, "layers": 4, "heads": 4,
                 "vocab": 2048, "seq_len": 512, "steps": 1200, "name": "llama-metaicl"}
TEMPLATE = "> {input} {label}"  # episodes.TEMPLATE
CUES = 6  # the FEEDER maps: one row per cue, and 8 shots, fit the 64-token context
FT = {"steps": 64, "batch_size": 8, "shots": 4, "lr": 3e-4, "warmup": 6, "save": False}
POOLS = ("full", "feeder", "random")
SELECTORS = ("random", "similarity")
SECTIONS = ("model", "cuts", "copy")
OLD_POOL = {"cues": CUES, "labels": 4, "pool": 400, "distractors": (1, 3)}  # parts 1-3's pool: the cuts' contrast


def provide(spec: dict) -> str:
    from llmx.core import zoo
    from llmx.core.zoo.request import RefRequest

    path, _ = zoo.provide(RefRequest(**spec), show_progress=True)
    return str(path)


def icl_eval(data: str, shots: int, selector: str = "random", pool: str = "full", feeder: str | None = None,
             limit: int | None = None) -> dict:
    params = {"data": f"{data}/pool.jsonl", "test": f"{data}/test.jsonl", "template": TEMPLATE, "shots": shots,
              "selector": selector, "pool": pool, "batch_size": 32, "resamples": 2000}
    return {"method": "icl", "params": params | ({"feeder": feeder} if feeder else {}) | (
        {"limit": limit} if limit else {})}


def set_rows(data: str, set_file: str) -> tuple[int, int]:
    """How many of the map's cues the FEEDER set holds a row of, and how many of its rows are mislabelled."""
    rows = [json.loads(x) for x in Path(data, "pool.jsonl").read_text().splitlines()]
    mapping = json.loads(Path(data, "map.json").read_text())["map"]
    members = [rows[i] for i in json.loads(Path(set_file).read_text())["indices"]]
    return len({r["cue"] for r in members}), sum(r["label"] != mapping[r["cue"]] for r in members)


def feeder_stage(data: str, cut: str = "random") -> dict:
    return {"method": "feeder", "stage": "analyze", "params": {"data": f"{data}/pool.jsonl", "template": TEMPLATE,
                                                               "batch_size": 32, "necessity_check": "pool", "cut": cut}}


def metaicl_corpus(fewshot: Path, out: Path) -> tuple[Path, dict]:
    """SST-2 and TREC training rows as episodes (blank-line separated): per episode one task, a fresh class ->
    label-word map, 12 (SST-2) or 20 (TREC) rows. Returns the file and the tasks' held-out pools and tests."""
    from llmx.plugins.feeder.episodes import LABEL_WORDS

    def sst2(name):
        return [(line[2:].strip(), line[0]) for line in (fewshot / "sst2" / name).read_text().splitlines() if line]

    def trec(name):
        rows = [line.split(" ", 1) for line in (fewshot / "trec" / name).read_text(errors="replace").splitlines()]
        return [(text.strip(), label.split(":")[0]) for label, text in rows]

    tasks = {"sst2": (sst2("stsa.binary.train"), sst2("stsa.binary.test"), 12),
             "trec": (trec("train.txt"), trec("test.txt"), 20)}
    rng = random.Random(0)
    held = {name: rng.sample(range(len(train)), 400) for name, (train, _, _) in tasks.items()}
    docs = []
    for k in range(8000):
        name = ("sst2", "trec")[k % 2]
        train, _, rows = tasks[name]
        classes = sorted({c for _, c in train})
        words = dict(zip(classes, rng.sample(LABEL_WORDS, len(classes)), strict=True))
        keep = set(held[name])
        picked = [train[i] for i in rng.sample(range(len(train)), rows * 2) if i not in keep][:rows]
        docs.append("\n".join(TEMPLATE.format(input=x, label=words[c]) for x, c in picked))
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "metaicl_sst2_trec.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    evals = {}
    for name, (train, test, _) in tasks.items():
        classes = sorted({c for _, c in train})
        words = dict(zip(classes, random.Random(f"eval:{name}").sample(LABEL_WORDS, len(classes)), strict=True))
        folder = out / name
        folder.mkdir(exist_ok=True)
        rows = lambda pairs: "".join(json.dumps({"input": x, "label": words[c]}) + "\n" for x, c in pairs)  # noqa
        (folder / "pool.jsonl").write_text(rows([train[i] for i in held[name]]))
        (folder / "test.jsonl").write_text(rows(random.Random(1).sample(test, 200)))
        evals[name] = {"dir": str(folder), "map": words}
    return corpus, evals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cut", default="random", choices=["random", "redundancy"],
                    help="how the tree cuts an oversized node; not random: results to feeder_cut_<cut>.*")
    ap.add_argument("--fewshot", default=None, help="the few-shot-learning data folder (sst2/, trec/) for part 4")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-feeder"),
                    help="finished runs are kept here; a rerun reuses them (delete it to start afresh)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="sections to run: model (parts 1-4, ref:llama-icl), cuts and copy (no trained model)")
    ap.add_argument("--maps", type=int, default=10, help="held-out maps 0..N-1 of the cuts and copy sections")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if {"cuts", "copy"} & set(args.only):
        model_free(args)
    if "model" in args.only:
        model_based(args)


def model_based(args) -> None:
    """Parts 1-4: the episode model's in-context learning, FEEDER's selection, k-shot accuracy and fine-tuning."""
    work = Path(args.work)
    model = provide(EPISODE_MODEL)

    def run(tag: str, stages: list[dict], seed: int = 0, on: str | None = None) -> list[dict]:
        folder = work / tag
        return cached(__file__, folder, {"model": on or model, "out": str(folder / "runs"), "seed": seed,
                                         "stages": stages})

    def episodes(cues: int, map_seed: int) -> str:
        stage = {"method": "icl-episodes", "stage": "analyze",
                 "params": {"cues": cues, "labels": 4, "pool": 400, "test": 200, "distractors": [1, 3],
                            "map_seed": map_seed}}
        return run(f"data_c{cues}_m{map_seed}", [stage])[0]["data_dir"]

    jobs = ThreadPoolExecutor(args.workers)
    checks = []
    for cues in (4, CUES, 8):
        for s in args.seeds:
            data = episodes(cues, 1000 + s)
            for shots in (4, 8) if cues == CUES else (8,):
                checks.append(((cues, s, shots), jobs.submit(run, f"check_c{cues}_m{s}_k{shots}",
                                                             [icl_eval(data, shots)])))
    check_rows = []
    for (cues, s, shots), fut in checks:
        m = fut.result()[0]
        check_rows.append({"cues": cues, "map": s, "shots": shots, "chance": m["chance"],
                           "acc_0shot": m["accuracy_0shot"], "acc_kshot": m["accuracy"],
                           "acc_kshot_ci": m["accuracy_ci"]})
    print(markdown(list(check_rows[0]), check_rows), flush=True)

    maps = {s: episodes(CUES, s) for s in args.seeds}
    picking = {s: jobs.submit(run, f"feeder_m{s}", [feeder_stage(data, args.cut)], s)
               for s, data in maps.items()}
    selections, icl_jobs, ft_jobs = {}, [], []
    for s, data in maps.items():
        sel = selections[s] = picking[s].result()[0]
        for shots in (4, 8):  # 8 >= the FEEDER set's size: the whole set in context
            for selector in SELECTORS:
                for kind in POOLS:
                    stage = icl_eval(data, shots, selector, kind, sel["set_file"])
                    icl_jobs.append(((s, shots, selector, kind),
                                     jobs.submit(run, f"icl_m{s}_k{shots}_{selector}_{kind}", [stage], s)))
        train = {"data": f"{data}/pool.jsonl", "template": TEMPLATE, "batch_size": FT["batch_size"], "cut": args.cut,
                 "shots": FT["shots"], "lr": FT["lr"], "warmup": FT["warmup"], "save": False, "max_length": 64}
        runs = {"full": {"pool": "full", "outer_rounds": 1, "steps": FT["steps"]},
                "feeder": {"pool": "feeder", "outer_rounds": 1, "steps": FT["steps"]},
                "feeder bi-level": {"pool": "feeder", "outer_rounds": 2, "steps": FT["steps"] // 2},
                "random": {"pool": "random", "feeder": sel["set_file"], "outer_rounds": 1, "steps": FT["steps"]}}
        for name, extra in runs.items():
            stages = [{"method": "feeder", "stage": "train", "params": train | extra}, icl_eval(data, 8)]
            ft_jobs.append(((s, name), jobs.submit(run, f"ft_m{s}_{name.replace(' ', '_')}", stages, s)))

    sel_rows = [{"seed": s, "pool_rows": m["pool_rows"], "feeder_rows": m["feeder_rows"],
                 "kept_share": m["kept_share"], "oracle_calls": m["oracle_calls"], "cache_hits": m["cache_hits"],
                 "sufficiency_rate": m["sufficiency_rate"], "rate_nonmembers": m["sufficiency_rate_nonmembers"],
                 **dict(zip(("cues_covered", "noisy_rows"), set_rows(maps[s], m["set_file"]), strict=True)),
                 "dropped_by_necessity": m["dropped_by_necessity"], "per_class": m["per_class"],
                 "budget_tokens": m["budget"], "truncations": m["truncations"]} for s, m in selections.items()]
    icl_rows = [{"seed": s, "shots": k, "selector": sel, "pool": kind, "pool_rows": m["pool_rows"],
                 "demos_per_query": m["demos_per_query"], "acc": m["accuracy"], "acc_ci": m["accuracy_ci"]}
                for (s, k, sel, kind), fut in icl_jobs for m in [fut.result()[0]]]
    ft_rows = [{"seed": s, "run": name, "selected_rows": tr["selected_rows"], "sequence_tokens": tr["sequence_tokens"],
                "label_tokens": tr["label_tokens"],
                "oracle_calls": tr["oracle_calls"], "final_loss": tr["rounds"][-1]["final_loss"],
                "acc_0shot": ev["accuracy_0shot"], "acc_8shot": ev["accuracy"]}
               for (s, name), fut in ft_jobs for tr, ev in [fut.result()]]

    summary = []
    for k in (4, 8):
        for selector in SELECTORS:
            acc = {kind: [r["acc"] for r in icl_rows if (r["shots"], r["selector"], r["pool"]) == (k, selector, kind)]
                   for kind in POOLS}
            summary.append({"part": "icl", "setting": f"{k}-shot {selector}",
                            **{kind: spread(v)["mean"] for kind, v in acc.items()},
                            "feeder_minus_full": spread(acc["feeder"])["mean"] - spread(acc["full"])["mean"],
                            "feeder_vs_random": verdict(acc["feeder"], acc["random"], ("feeder", "random"), False)})
    for metric in ("acc_0shot", "acc_8shot"):
        acc = {name: [r[metric] for r in ft_rows if r["run"] == name] for name in
               ("full", "feeder", "feeder bi-level", "random")}
        summary.append({"part": "fine-tune", "setting": metric, "full": spread(acc["full"])["mean"],
                        "feeder": spread(acc["feeder"])["mean"], "feeder bi-level": spread(acc["feeder bi-level"])[
                            "mean"], "random": spread(acc["random"])["mean"],
                        "feeder_minus_full": spread(acc["feeder"])["mean"] - spread(acc["full"])["mean"],
                        "feeder_vs_random": verdict(acc["feeder"], acc["random"], ("feeder", "random"), False)})

    natural = natural_text(args, work, run) if args.fewshot else None
    payload = {"benchmark": "feeder", "cut": args.cut, "model": EPISODE_MODEL, "template": TEMPLATE, "fine_tune": FT,
               "icl_check": check_rows, "selection": sel_rows, "icl": icl_rows, "fine_tuning": ft_rows,
               "summary": summary, "natural_text": natural, "machine": machine()}
    name = "feeder" if args.cut == "random" else f"feeder_cut_{args.cut}"
    write(name, payload)
    md = ["## In-context learning check (random demonstrations, full 400-row pool)",
          markdown(list(check_rows[0]), check_rows), "", f"## FEEDER selection ({CUES} cues, 400 rows, tree to one node)",
          markdown(list(sel_rows[0]), sel_rows), "", "## Summary over seeds (means; verdict: ranges over seeds)",
          markdown(["part", "setting", "full", "feeder", "feeder bi-level", "random", "feeder_minus_full",
                    "feeder_vs_random"], summary), "", "## k-shot accuracy per seed", markdown(list(icl_rows[0]),
                                                                                              icl_rows),
          "", "## Fine-tuning per seed", markdown(list(ft_rows[0]), ft_rows)]
    if natural:
        md += ["", "## SST-2 and TREC, MetaICL-style episode model", markdown(list(natural["rows"][0]),
                                                                            natural["rows"]), "", natural["verdict"]]
    (RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


def natural_text(args, work: Path, run) -> dict:
    """Part 4: 0-shot vs 8-shot on SST-2 and TREC with a MetaICL-style model; FEEDER when it learns in context."""
    corpus, evals = metaicl_corpus(Path(args.fewshot), work / "metaicl")
    model = provide(NATURAL_MODEL | {"data": str(corpus)})
    rows, learns = [], {}
    for name, info in evals.items():
        accs = []
        for s in args.seeds:
            m = run(f"natural_{name}_s{s}", [icl_eval(info["dir"], 8)], s, on=model)[0]
            accs.append(m)
            rows.append({"task": name, "seed": s, "chance": m["chance"], "acc_0shot": m["accuracy_0shot"],
                         "acc_8shot": m["accuracy"], "acc_8shot_ci": m["accuracy_ci"]})
        learns[name] = min(a["accuracy_ci"][0] for a in accs) > max(a["accuracy_0shot"] for a in accs) + 0.05
        if learns[name]:
            for s in args.seeds:
                sel = run(f"natural_{name}_feeder_s{s}", [feeder_stage(info["dir"])], s, on=model)[0]
                for kind in POOLS:
                    m = run(f"natural_{name}_s{s}_{kind}", [icl_eval(info["dir"], 8, "random", kind,
                                                                     sel["set_file"])], s, on=model)[0]
                    rows.append({"task": name, "seed": s, "pool": kind, "pool_rows": m["pool_rows"],
                                 "acc_8shot": m["accuracy"], "acc_8shot_ci": m["accuracy_ci"]})
    words = []
    for name, ok in learns.items():
        words.append(f"{name}: " + ("8-shot clearly above 0-shot; FEEDER measurable" if ok else
                                    "no in-context learning (8-shot not clearly above 0-shot): FEEDER cannot be "
                                    "measured on this natural text at this scale"))
    return {"model": NATURAL_MODEL, "label_maps": {k: v["map"] for k, v in evals.items()}, "rows": rows,
            "learns_in_context": learns, "verdict": "; ".join(words)}


def icl_stand_in():
    """ref:llama-icl's tokenizer (``train_bpe`` on the icl-episodes training documents at the preset's vocabulary, as
    the zoo trains it), a random-weight Llama of the preset's shape and the preset's training context (the prompt
    length ``analyze --method feeder`` uses for it): what the tree's cuts depend on, without the 40000-step build."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmx.core.models.archs import config
    from llmx.core.tokenizer import train_bpe
    from llmx.core.zoo.corpus import special_ids
    from llmx.core.zoo.presets import PRESETS
    from llmx.plugins.feeder import episodes as E

    preset = PRESETS[EPISODE_MODEL["preset"]][EPISODE_MODEL["arch"]]
    tok = train_bpe(E.documents("train"), preset.vocab)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config("llama", len(tok), preset.hidden, preset.layers,
                                                    max_positions=max(1024, 2 * preset.seq_len), heads=preset.heads,
                                                    kv_heads=preset.kv_heads, special_ids=special_ids(tok))).eval()
    return tok, model, preset.seq_len


def budget_copier(rows: list[dict], labels: list[str], lm):
    """The exact copier asked only what fits the LM oracle ``lm``'s prompt (its tokens per row and budget), so that
    the tree cuts a node exactly where it would with a model that infers every row from a row of its cue."""
    from llmx.plugins.feeder.oracle import CopyOracle

    class BudgetCopy(CopyOracle):
        def fits(self, demos) -> bool:
            return super().fits(demos) and sum(lm.lengths[d] for d in demos) <= lm.budget

    return BudgetCopy(rows, labels)


def tree_defaults():
    """``analyze --method feeder``'s defaults (the tree to one node, the necessity pass over the pool, random cuts,
    random_draws) as the plugin's comparison runs it (``plugin.SELECT``)."""
    from llmx.plugins.feeder import episodes as E
    from llmx.plugins.feeder.config import FeederParams
    from llmx.plugins.feeder.plugin import SELECT

    return FeederParams(**SELECT["params"], template=E.TEMPLATE)  # the template an icl-episodes stage hands on


def choose(oracle, p, seed: int):
    from llmx.plugins.feeder.tree import select

    return select(oracle, p.depth, p.rounds, p.necessity_pass, p.repair_pass, seed, p.necessity_check, p.cut)


def default_pool(map_seed: int, **change) -> dict:
    """icl-episodes' default pool of one held-out map (``plugin.EPISODES``' parameters), with ``change`` applied."""
    from llmx.plugins.feeder import episodes as E
    from llmx.plugins.feeder.config import EpisodeParams
    from llmx.plugins.feeder.plugin import EPISODES

    q = EpisodeParams(**EPISODES["params"] | change)
    return E.heldout(E.Spec(cues=q.cues, labels=q.labels, distractors=q.distractors, noise=q.noise), q.pool, 1,
                     map_seed)


def cut_rows(maps: list[int], seeds: list[int]) -> tuple[list[dict], dict]:
    """Section cuts: the tree's cuts per map and oracle at the default pool, and on the old 400-row pool."""
    from llmx.plugins.feeder import episodes as E
    from llmx.plugins.feeder.oracle import LMOracle

    tok, model, context = icl_stand_in()
    p = tree_defaults()
    recorded = {}  # the trained model's cuts on the same 400-row pools and seeds, as the repository records them
    old = Path(__file__).resolve().parent / "results" / "feeder.json"
    if old.is_file():
        recorded = {r["seed"]: r["truncations"] for r in json.loads(old.read_text()).get("selection", [])}
    pools = [("default", m, default_pool(m)) for m in maps]
    pools += [("old 400-row", s, E.heldout(E.Spec(cues=OLD_POOL["cues"], labels=OLD_POOL["labels"],
                                                  distractors=OLD_POOL["distractors"]), OLD_POOL["pool"], 1, s))
              for s in seeds]
    rows = []
    for pool, m, made in pools:
        lm = LMOracle(model, tok, E.FORMAT, made["pool"], made["labels"], p.batch_size, p.max_node_size, context)
        tokens = sum(lm.lengths)
        for name, oracle in (("random-weight LM", lm), ("copier within budget",
                                                         budget_copier(made["pool"], made["labels"], lm))):
            sel = choose(oracle, p, m)
            rows.append({"pool": pool, "map": m, "oracle": name, "pool_rows": len(made["pool"]),
                         "pool_tokens": tokens, "budget_tokens": lm.budget, "whole_pool_fits": tokens <= lm.budget,
                         "truncations": sel.truncations, "truncated_rows": sel.truncated_rows,
                         "feeder_rows": len(sel.indices), "oracle_calls": sel.oracle_calls,
                         "sufficiency_rate": sel.sufficiency_rate,
                         "recorded_truncations": recorded.get(m) if pool != "default" else None})
    by = {}
    for pool in ("default", "old 400-row"):
        mine = [r for r in rows if r["pool"] == pool]
        if mine:
            cuts = [r["truncations"] for r in mine]
            fits = {r["map"]: r["whole_pool_fits"] for r in mine}
            by[pool] = {"selections": len(cuts), "truncations_min": min(cuts), "truncations_max": max(cuts),
                        "maps": len(fits), "maps_whole_pool_fits": sum(fits.values())}
    by["recorded with ref:llama-icl (feeder.json, old 400-row pool)"] = sorted(recorded.values()) or None
    return rows, by


def copy_rows(maps: list[int]) -> tuple[list[dict], list[dict]]:
    """Section copy: the exact copier's verdict on the default pool at noise 0 and at the default noise."""
    from collections import Counter

    from llmx.plugins.feeder.config import EpisodeParams
    from llmx.plugins.feeder.oracle import CopyOracle
    from llmx.plugins.feeder.tree import inferred, versus_random

    p = tree_defaults()
    rows, verdicts = [], []
    for noise in (0.0, EpisodeParams.model_fields["noise"].default):
        for m in maps:
            made = default_pool(m, noise=noise)
            pool = made["pool"]
            oracle = CopyOracle(pool, made["labels"])
            sel = choose(oracle, p, m)
            cues = [pool[i]["cue"] for i in sel.indices]
            per_cue = Counter((r["cue"], r["label"]) for r in pool)
            best = sum(max(c for (cue, _), c in per_cue.items() if cue == k) for k in {r["cue"] for r in pool})
            removals = []
            for i in sel.indices:  # a cue's only row: its removal fails that cue's inferred rows, nothing else
                rest = inferred(oracle, [j for j in sel.indices if j != i])
                want = [x for x, r in enumerate(pool) if r["cue"] == pool[i]["cue"] and sel.inferred[x]]
                changed = [x for x in range(len(pool)) if rest[x] != sel.inferred[x]]
                removals.append(bool(want) and changed == want and not any(rest[x] and not sel.inferred[x]
                                                                           for x in changed))
            vs = versus_random(oracle, sel.indices, sel.inferred, p.random_draws, m) if p.random_draws else {}
            rows.append({"noise": noise, "map": m, "pool_rows": len(pool), "cues_in_pool": len(set(r["cue"] for r in
                                                                                               pool)),
                         "noisy_rows": sum(r["label"] != made["map"][r["cue"]] for r in pool),
                         "feeder_rows": len(sel.indices), "noisy_kept": sum(pool[i]["label"] != made["map"][
                             pool[i]["cue"]] for i in sel.indices),
                         "one_row_per_cue": sorted(cues) == sorted({r["cue"] for r in pool}),
                         "inferred": sum(sel.inferred), "best_possible": best,
                         "as_sufficient_as_any_set": sum(sel.inferred) == best,
                         "removals_failing_exactly_their_cue": f"{sum(removals)}/{len(removals)}",
                         "truncations": sel.truncations, "oracle_calls": sel.oracle_calls,
                         "random_subset_rate": vs.get("random_sufficiency_rate"),
                         "set_minus_random": vs.get("sufficiency_minus_random"),
                         "set_minus_random_ci": [round(vs["sufficiency_minus_random_ci_low"], 4),
                                                 round(vs["sufficiency_minus_random_ci_high"], 4)] if vs else None,
                         "_removals": removals})
        mine = [r for r in rows if r["noise"] == noise]
        checks = {"one_row_per_cue": [r["one_row_per_cue"] for r in mine],
                  "as_sufficient_as_any_set": [r["as_sufficient_as_any_set"] for r in mine],
                  "removal_fails_exactly_its_cue": [ok for r in mine for ok in r["_removals"]]}
        for name, oks in checks.items():
            verdicts.append({"noise": noise, "check": name, "over": "removals" if "removal" in name else "maps",
                             "passed": sum(oks), "failed": len(oks) - sum(oks),
                             "verdict": "pass" if all(oks) else "fail"})
    for r in rows:
        del r["_removals"]
    return rows, verdicts


def model_free(args) -> None:
    """Sections cuts and copy: feeder_defaults.json and .md."""
    from llmx.plugins.feeder.config import EpisodeParams
    from llmx.plugins.feeder.plugin import EPISODES

    maps = list(range(args.maps))
    payload = {"benchmark": "feeder_defaults", "sections": [s for s in SECTIONS if s in args.only and s != "model"],
               "pool": EpisodeParams(**EPISODES["params"]).model_dump(mode="json", exclude={"map_seed"}),
               "feeder": tree_defaults().model_dump(mode="json", exclude={"data", "labels", "oracle"}),
               "maps": maps}
    md = []
    if "cuts" in args.only:
        rows, by = cut_rows(maps, args.seeds)
        payload |= {"cuts": rows, "cuts_summary": by, "old_pool": OLD_POOL}
        md += [f"## Cuts at the default pool ({EPISODES['params']['cues']} cues, "
               f"{EPISODES['params']['labels']} labels, icl-episodes' default rows), ref:llama-icl's tokenizer and "
               "context; contrast: the old 400-row pool", markdown(list(rows[0]), rows), "",
               markdown(["pool", "selections", "truncations_min", "truncations_max", "maps",
                         "maps_whole_pool_fits"],
                        [{"pool": k, **v} for k, v in by.items() if isinstance(v, dict)]), "",
               "Recorded with the trained ref:llama-icl on the old 400-row pool (feeder.json): "
               f"{by['recorded with ref:llama-icl (feeder.json, old 400-row pool)']}", ""]
    if "copy" in args.only:
        rows, verdicts = copy_rows(maps)
        payload |= {"copy": rows, "copy_verdict": verdicts}
        md += ["## The exact copier (oracle: copy) on the default pool", markdown(list(rows[0]), rows), "",
               "## The copier's verdict (pass and fail counts)", markdown(list(verdicts[0]), verdicts), ""]
    payload["machine"] = machine()
    write("feeder_defaults", payload)
    (RESULTS / "feeder_defaults.md").write_text("\n".join(md))
    print("\n".join(md), flush=True)


if __name__ == "__main__":
    main()
