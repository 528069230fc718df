from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("lm", (Stage.TRAIN,), "llmx.core.train.lm.run:run", "llmx.core.train.lm.params:LMParams",
                     summary="Causal-LM training, from scratch or continued, with checkpoint series and cooldowns.",
                     paper="training stage")
    yield MethodSpec("sft", (Stage.TRAIN,), "llmx.core.train.sft.run:run", "llmx.core.train.sft.params:SFTParams",
                     summary="Supervised fine-tuning on prompt/completion or chat rows, loss on completions only.",
                     paper="training stage")
