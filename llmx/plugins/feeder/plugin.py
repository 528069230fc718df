from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import DatasetSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Jin et al., ICML 2025 (PMLR 267:28157-28186)"


@hookimpl
def llmx_methods():
    yield MethodSpec("feeder", (Stage.ANALYZE,), "llmx.plugins.feeder.method:analyze", "llmx.plugins.feeder.config:FeederParams",
                     summary="FEEDER: pre-select the demonstrations sufficient and necessary to infer the pool, with a "
                     "tree of pairwise sufficiency checks by the model itself (a reconstruction).", paper=PAPER)
    yield MethodSpec("feeder", (Stage.TRAIN,), "llmx.plugins.feeder.method:train", "llmx.plugins.feeder.config:FeederTrainParams",
                     summary="FEEDER bi-level fine-tuning: re-select with the current model, then fine-tune on "
                     "in-context sequences of the selection (or of the full pool / a random subset).", paper=PAPER)
    yield MethodSpec("icl", (Stage.EVAL,), "llmx.plugins.feeder.method:evaluate", "llmx.plugins.feeder.config:IclEvalParams",
                     summary="In-context classification: 0-shot and k-shot accuracy, demonstrations by a random or "
                     "similarity selector from the full pool, a FEEDER set or a random subset of its size.",
                     paper="evaluation")
    yield MethodSpec("icl-episodes", (Stage.ANALYZE,), "llmx.plugins.feeder.method:episodes",
                     "llmx.plugins.feeder.config:EpisodeParams",
                     summary="A held-out cue -> label map's pool (noisy) and test rows for in-context learning.",
                     paper="evaluation")


@hookimpl
def llmx_datasets():
    yield DatasetSpec("icl-episodes", "llmx.plugins.feeder.episodes:documents",
                      "in-context episodes: a fresh cue-word -> label-word map per document, one cue among distractors "
                      "per input, 5% label noise (6000 train / 300 validation episodes)")


# Per seed a held-out map (6 cues, 4 labels) with icl-episodes' default pool: 12 noisy rows of one distractor and a
# cue, which fit ref:llama-icl's 64-token context whole, so the tree never cuts a node (a 400-row pool forced 42-47
# cuts a selection and left sets of 3-9 rows); 200 clean test rows; the tree to one node, its necessity pass checking
# the whole pool (the notes' wording); 8 demonstrations per query drawn at random from what each arm keeps. The quick
# form selects with the exact copier (oracle copy), the test model's stdlib tokenizer splitting the episode words.
EPISODES = {"method": "icl-episodes", "params": {"cues": 6, "labels": 4, "test": 200}}
SELECT = {"method": "feeder", "params": {"batch_size": 32, "necessity_check": "pool"}}


def _icl(pool: str) -> dict:
    return {"method": "icl", "params": {"pool": pool, "shots": 8, "selector": "random", "batch_size": 32}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="feeder",
        summary="Demonstrations drawn from the FEEDER set against a random subset of its size and the whole pool, "
                "on a held-out cue -> label map a model that learns in context never saw: each test row's accuracy "
                "with 8 demonstrations drawn at random (a set or subset of 8 rows or fewer is shown whole, so the "
                "full pool's arm also shows more rows), paired across arms; each arm's 0-shot accuracy is reported "
                "beside it (how much the demonstrations add), and its accuracy by whether a demonstration shows the "
                "query's cue (cue_shown: copying it is what learning in context means here). 20 seeds, each its "
                "own map: an arm's accuracy differs by map far more than by test row, and a seed takes seconds.",
        paper=f"{PAPER}, Table 1 (in-context learning: FEEDER's set against the full training set and random "
              "subsets, with a random demonstration selector)",
        target="feeder", baselines=("random-subset", "full-pool"),
        arms=(Arm("full-pool", (EPISODES, _icl("full")), family="full pool"),
              Arm("random-subset", (EPISODES, SELECT, _icl("random")), family="random subset"),
              Arm("feeder", (EPISODES, SELECT, _icl("feeder")), family="feeder")),
        evaluation=None, items="rows.jsonl", metric="accuracy", higher_is_better=True, seeds=tuple(range(20)),
        report=("accuracy_0shot",), shares=("accuracy", "accuracy_0shot"), by="cue_shown",
        cost="demonstration pool (rows)", cost_key="demo_pool_rows",
        quick={"cues": 4, "shots": 2, "oracle": "copy", "limit": 12},
        model="ref:llama-icl", quick_model="ref:llama-test", data={"source": "icl-episodes", "seq_len": 64}, corpus=False)
