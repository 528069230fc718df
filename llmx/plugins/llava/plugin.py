from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Liu et al., NeurIPS 2023 (arXiv 2304.08485); LLaVA-1.5, CVPR 2024 (arXiv 2310.03744)"


@hookimpl
def llmx_methods():
    yield MethodSpec("llava", (Stage.TRAIN,), "llmx.plugins.llava.method:train",
                     "llmx.core.multimodal.params:LlavaTrainParams", paper=PAPER,
                     summary="LLaVA stages 1 and 2: the projector, then projector and LM, on image conversations.")
    yield MethodSpec("scenes-vqa", (Stage.EVAL,), "llmx.plugins.llava.method:evaluate",
                     "llmx.plugins.llava.config:ScenesVQAParams",
                     paper="evaluation",
                     summary="Held-out digit-scene VQA per language (six MMMB languages): choice, open or captions.")


LANGUAGES = ("en", "zh", "ru", "pt", "ar", "tr")


def _stage2(languages: dict[str, float]) -> dict:
    """bench_llava.py's stage 2 from ref:llava's stage-1 model: 300 steps of 16 conversations (open questions and
    multiple choice) at 1e-3, projector and LM trained, the tower frozen."""
    return {"method": "llava", "params": {"stage": 2, "steps": 300, "lr": 1e-3, "batch_size": 16, "save": False,
                                          "eval_rows": 0, "scenes": {"count": 4000, "languages": languages}}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="llava",
        summary="LLaVA's stage 2 (projector + LM on English visual conversations) against the stage-1 model "
                "(projector only), and stage 2 on six languages drawn: open questions on held-out scenes asked in "
                "the six MMMB languages, each question's score paired across arms (Parrot's premise: English-only "
                "instruction tuning leaves the other languages behind).",
        paper=f"{PAPER}: the two-stage recipe; the multilingual premise of Sun et al., ICML 2025 (Parrot), Fig. 1",
        target="stage2-en", baselines=("stage1-only",),
        arms=(Arm("stage1-only", family="stage 1", cost=0.0),
              Arm("stage2-en", (_stage2({"en": 1.0}),), family="stage 2 (English)"),
              Arm("stage2-all", (_stage2({lang: 1.0 for lang in LANGUAGES}),), family="stage 2 (six languages)")),
        evaluation={"method": "scenes-vqa", "params": {"format": "open", "count": 100}}, items="answers.jsonl",
        metric="accuracy", higher_is_better=True, cost="stage-2 steps", cost_key="steps",
        quick={"steps": 2, "batch_size": 4, "count": 4},
        model="ref:llava", quick_model="ref:llava-test", kinds=("llava",),
        data={"source": "stdlib", "seq_len": 128}, corpus=False)
