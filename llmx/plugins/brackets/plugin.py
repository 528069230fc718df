from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.brackets.config import BracketsDataParams, BracketsEvalParams


@hookimpl
def llmx_methods():
    yield MethodSpec("brackets", (Stage.ANALYZE,), "llmx.plugins.brackets.method:build", BracketsDataParams,
                     summary="Preference task: sample call completions on stdlib code, label by balanced brackets, "
                     "write paired / unpaired .jsonl.", paper="task")
    yield MethodSpec("brackets", (Stage.EVAL,), "llmx.plugins.brackets.method:evaluate", BracketsEvalParams,
                     summary="Preference task metric: rate of balanced completions on held-out prompts, and the "
                     "KL drift from the reference.", paper="task")
