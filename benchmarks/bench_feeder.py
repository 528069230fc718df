"""FEEDER against the full pool and a random subset of its size, on a Llama that learns in context.

    python benchmarks/bench_feeder.py [--seeds 0 1 2] [--workers 2] [--fewshot ../shared/data/fewshot]
                                      [--cut random|redundancy]

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
benchmarks/results/feeder.json and .md (``--cut redundancy``: feeder_cut_redundancy.json and .md).

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
from common import cached, child, machine, markdown, spread, verdict, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EPISODE_MODEL = {"arch": "llama", "preset": "icl"}  # ref:llama-icl: the icl-episodes corpus
NATURAL_MODEL = {"arch": "llama", "preset": "bench", "text_split": "blocks", "hidden": 128, "layers": 4, "heads": 4,
                 "vocab": 2048, "seq_len": 512, "steps": 1200, "name": "llama-metaicl"}
TEMPLATE = "> {input} {label}"  # episodes.TEMPLATE
CUES = 6  # the FEEDER maps: one row per cue, and 8 shots, fit the 64-token context
FT = {"steps": 64, "batch_size": 8, "shots": 4, "lr": 3e-4, "warmup": 6, "save": False}
POOLS = ("full", "feeder", "random")
SELECTORS = ("random", "similarity")


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
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
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
    (Path(__file__).resolve().parent / "results" / f"{name}.md").write_text("\n".join(md) + "\n")
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


if __name__ == "__main__":
    main()
