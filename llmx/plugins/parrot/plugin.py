from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Sun et al., Parrot: Multilingual Visual Instruction Tuning, ICML 2025 (arXiv 2406.02539)"


@hookimpl
def llmx_methods():
    yield MethodSpec("parrot", (Stage.TRAIN,), "llmx.plugins.parrot.method:train",
                     "llmx.plugins.parrot.config:ParrotTrainParams", paper=PAPER,
                     summary="LLaVA stages with a language-conditioned MoE on the visual tokens (stage 1 / 2).")
    yield MethodSpec("mmmb", (Stage.EVAL,), "llmx.plugins.parrot.method:evaluate",
                     "llmx.plugins.parrot.config:MmmbParams", paper=PAPER,
                     summary="MMMB / multilingual MMBench multiple choice per language and category (VLMEvalKit TSV).")


@hookimpl
def llmx_layers():
    yield LayerSpec("parrot_moe", "llmx.plugins.parrot.moe:MultilingualMoE.rebuild",
                    "Parrot's language-conditioned MoE on a LLaVA model's visual tokens")
