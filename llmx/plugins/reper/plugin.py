from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Wei et al., ICML 2025 (arXiv 2504.07165)"


@hookimpl
def llmx_methods():
    yield MethodSpec("reper", (Stage.ALIGN,), "llmx.plugins.reper.method:align",
                     "llmx.plugins.reper.config:RPLParams", paper=PAPER,
                     summary="RePer's reflective unlikelihood on policy/critic dialogues (RPL), beside SFT on every "
                     "or the best answer and DPO, on the same rows.")
    yield MethodSpec("reper", (Stage.ANALYZE,), "llmx.plugins.reper.method:build",
                     "llmx.plugins.reper.config:BuildParams", paper=PAPER,
                     summary="Build reflection dialogues: 8 captions per scene, scored by a critic, worst to best "
                     "with its feedback between.")
    yield MethodSpec("reper", (Stage.DECODE,), "llmx.plugins.reper.method:decode",
                     "llmx.plugins.reper.config:TurnsParams", paper=PAPER,
                     summary="Multi-turn reflective inference: policy answers, critic replies, up to max_trials; "
                     "caption F1 and hallucination per turn.")
