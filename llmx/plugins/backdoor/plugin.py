from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("backdoor", (Stage.ANALYZE,), "llmx.plugins.backdoor.method:analyze",
                     "llmx.plugins.backdoor.config:BackdoorDataParams",
                     summary="A code-injection backdoor task: poisoned and clean next-line rows, a 100-row clean "
                     "defence set, paired clean / triggered test prompts (.jsonl).", paper="evaluation")
    yield MethodSpec("backdoor", (Stage.TRAIN,), "llmx.plugins.backdoor.method:train",
                     "llmx.plugins.backdoor.config:BackdoorTrainParams", aliases=("backdoor-train",),
                     summary="Plain LoRA SFT on the run's backdoor rows: the implant (poisoned), its never-poisoned "
                     "twin (clean), or the plain fine-tuning defence (defence).", paper="evaluation")
    yield MethodSpec("backdoor", (Stage.EVAL,), "llmx.plugins.backdoor.method:evaluate",
                     "llmx.plugins.backdoor.config:BackdoorEvalParams", aliases=("backdoor-eval",),
                     summary="Attack success rate, false triggers, clean exact match, held-out perplexity and layer "
                     "inconsistency on triggered vs clean prompts.", paper="evaluation")
