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
