from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Sun et al., Parrot: Multilingual Visual Instruction Tuning, ICML 2025 (arXiv 2406.02539)"


@hookimpl
def llmx_methods():
    yield MethodSpec("parrot", (Stage.TRAIN,), "llmx.plugins.parrot.method:train",
                     "llmx.plugins.parrot.config:ParrotTrainParams", paper=PAPER,
                     summary="LLaVA stages with a language-conditioned MoE on the visual tokens (stage 1 / 2).")
    yield MethodSpec("mmmb", (Stage.EVAL,), "llmx.plugins.parrot.evaluate:evaluate",
                     "llmx.plugins.parrot.config:MmmbParams", paper=PAPER,
                     summary="MMMB / multilingual MMBench multiple choice per language and category (VLMEvalKit TSV).")


@hookimpl
def llmx_layers():
    yield LayerSpec("parrot_moe", "llmx.plugins.parrot.moe:MultilingualMoE.rebuild",
                    "Parrot's language-conditioned MoE on a LLaVA model's visual tokens")


# bench_parrot.py's setting: stage 2 from ref:llava's stage-1 model on English-centric rows (90% English, 2% each of
# the other five MMMB languages, the notes' imbalance), 300 steps of 16 at 1e-3 (Parrot's 2e-5 is for a 7B model; a
# 1.4M-parameter LM barely moves at it), the same rows, order and rate for both arms.
MIX = {"en": 0.9, "zh": 0.02, "ru": 0.02, "pt": 0.02, "ar": 0.02, "tr": 0.02}
STAGE2 = {"stage": 2, "steps": 300, "lr": 1e-3, "batch_size": 16, "save": False, "eval_rows": 0,
          "scenes": {"count": 4000, "languages": MIX}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="parrot",
        summary="Parrot's language-conditioned MoE on the visual tokens against LLaVA's stage 2 (projector + LM) on "
                "the same English-centric rows and steps: MMMB-format questions on held-out scenes in six "
                "languages, each question's score paired across arms; the accuracy per language beside it, and the "
                "routing diagnostic of each Parrot run (a nearest-centroid classifier of the language from the gates, "
                "before and after stage 2, against chance; each language's top expert).",
        paper=f"{PAPER}, Table 2 (MMMB: Parrot against LLaVA-1.5 in six languages)",
        target="parrot", baselines=("llava",),
        arms=(Arm("stage1-only", family="stage 1", cost=0.0),
              Arm("llava", ({"method": "llava", "params": STAGE2},), family="llava"),
              Arm("parrot", ({"method": "parrot", "params": STAGE2},), family="parrot")),
        evaluation={"method": "mmmb", "params": {"count": 500}}, items="questions.jsonl", metric="accuracy",
        higher_is_better=True, by="language", shares=("accuracy",),
        diagnostics=("routing_language_accuracy_init", "routing_language_accuracy", "routing_chance",
                     "routing_top_expert"),
        cost="stage-2 steps", cost_key="steps",
        quick={"steps": 2, "batch_size": 4, "scenes": {"count": 24, "languages": MIX}, "routing_scenes": 0,
               "count": 4, "max_new_tokens": 8},
        seeds=(0, 1, 2, 3, 4),  # issue 69: at least 5 training seeds x 500 questions per language
        model="ref:llava", quick_model="ref:llava-test", kinds=("llava",),
        data={"source": "stdlib", "seq_len": 128}, corpus=False)
