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
