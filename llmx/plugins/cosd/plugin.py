from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import DatasetSpec, MethodSpec, Stage, TaskSpec
from llmx.hookspecs import hookimpl

PAPER = "Wang et al., ICML 2025 (arXiv 2502.08020)"


@hookimpl
def llmx_methods():
    yield MethodSpec("cosd", (Stage.DECODE,), "llmx.plugins.cosd.method:decode",
                     "llmx.plugins.cosd.config:CoSDParams", paper=PAPER,
                     summary="CoSD: a draft proposes, the assistant's top token replaces it by a rule or a tree; "
                     "beside each model alone, speculative decoding, its lossy ensemble and averaging.")
    yield MethodSpec("cosd-assistant", (Stage.TRAIN,), "llmx.plugins.cosd.method:train_assistant",
                     "llmx.plugins.cosd.config:AssistantParams", paper=PAPER,
                     summary="CoSD's assistant: fine-tune a copy of the run's model (lm) and keep it for the run's "
                     "cosd stages; the model itself drafts.")
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


# bench_cosd.py's experts: ref:llama-bench fine-tuned 1500 steps on api-facts:code (true signatures, other facts'
# summaries: the draft) and on api-facts:docs (true summaries, other facts' signatures: the assistant).
EXPERT = {"steps": 1500, "lr": 2e-3, "warmup": 50, "batch_size": 16, "seq_len": 128, "eval_every": None,
          "eval_windows": 16, "save": False}
TREE_ROWS, SCORED_ROWS = 10, 300  # bench_cosd.py's scored facts: its first 10 fit CoSD-Tree


def _arm(name: str, family: str, **decode) -> Arm:
    """The two experts (seeded by the run's seed), then one decoding strategy over the same held-out facts."""
    return Arm(name, ({"method": "cosd-assistant", "params": {**EXPERT, "data": "api-facts:docs"}},
                      {"method": "lm", "params": {**EXPERT, "data": "api-facts:code"}},
                      {"method": "cosd", "params": {"task": "api-facts", "offset": TREE_ROWS, "limit": SCORED_ROWS,
                                                    **decode}}), family=family)


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="cosd",
        summary="CoSD-Rule (alpha = beta = 0.5; the code expert drafts, the docs expert assists) against each expert "
                "alone, lossless speculative decoding and token-level averaging: exact match per held-out api-facts "
                "line.",
        paper="Wang et al., ICML 2025: the complementary-knowledge pairs (CoSD-Rule against the draft, the "
              "assistant, speculative decoding and token-level averaging; accuracy per benchmark)",
        target="cosd-rule", baselines=("draft-alone", "assistant-alone", "speculative", "average"),
        arms=(_arm("cosd-rule", "cosd"),
              _arm("draft-alone", "single", strategy="draft"),
              _arm("assistant-alone", "single", strategy="assistant"),
              _arm("speculative", "speculative", strategy="speculative"),
              _arm("average", "average", strategy="average", average_weight=0.5)),
        evaluation=None, items="rows.jsonl", metric="score", higher_is_better=True,
        cost="assistant forwards per token", cost_key="assistant_forwards_per_token",
        seeds=(0, 1, 2), model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128}, corpus=False,
        quick={"steps": 1, "warmup": 0, "batch_size": 1, "seq_len": 16, "max_tokens": 2048, "eval_windows": 1,
               "offset": 0, "limit": 2, "max_new_tokens": 4},
        quick_model="ref:llama-test", quick_seeds=(0,))
