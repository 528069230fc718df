from llmx.core.spec import DatasetSpec, MethodSpec, Stage, TaskSpec
from llmx.hookspecs import hookimpl

PAPER = "Wang et al., ICML 2025 (arXiv 2502.08020)"


@hookimpl
def llmx_methods():
    yield MethodSpec("cosd", (Stage.DECODE,), "llmx.plugins.cosd.method:decode",
                     "llmx.plugins.cosd.config:CoSDParams", paper=PAPER,
                     summary="CoSD: a draft proposes, the assistant's top token replaces it by a rule or a tree; "
                     "beside each model alone, speculative decoding, its lossy ensemble and averaging.")
    yield MethodSpec("cosd-tree", (Stage.TRAIN,), "llmx.plugins.cosd.method:train_tree",
                     "llmx.plugins.cosd.config:TreeTrainParams", paper=PAPER,
                     summary="CoSD-Tree: fit the replace/keep CART on (P_draft, P_assistant) from a few examples.")


@hookimpl
def llmx_datasets():
    yield DatasetSpec("api-facts", "llmx.plugins.cosd.facts:true_documents",
                      "one line per stdlib function: signature -- docstring summary (inspect; 20 copies)")
    yield DatasetSpec("api-facts:code", "llmx.plugins.cosd.facts:code_documents",
                      "api-facts with true signatures and other facts' summaries (the code expert's corpus)")
    yield DatasetSpec("api-facts:docs", "llmx.plugins.cosd.facts:docs_documents",
                      "api-facts with true summaries and other facts' signatures (the docs expert's corpus)")


@hookimpl
def llmx_tasks():
    yield TaskSpec("api-facts", "llmx.plugins.cosd.facts:rows", "llmx.plugins.cosd.facts:judge", splits=("train",),
                   stop=("\n",), max_new_tokens=48, summary="Recall a stdlib function's line after its name and "
                   "'(' (exact match; the note scores each half).")
    yield TaskSpec("line-rest:stdlib", "llmx.plugins.cosd.lines:stdlib_rows", "llmx.plugins.cosd.lines:judge",
                   stop=("\n",), max_new_tokens=24, summary="Finish a line of held-out stdlib code after 400 "
                   "characters of it (exact match).")
    yield TaskSpec("line-rest:pydoc", "llmx.plugins.cosd.lines:pydoc_rows", "llmx.plugins.cosd.lines:judge",
                   stop=("\n",), max_new_tokens=24, summary="Finish a line of held-out pydoc prose after 400 "
                   "characters of it (exact match).")
