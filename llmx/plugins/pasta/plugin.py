from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.models.archs import ATTENTION_KINDS
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Jin et al., ICML 2025 (PMLR 267:27941-27956)"


@hookimpl
def llmx_methods():
    yield MethodSpec("pasta-annotate", (Stage.ANALYZE,), "llmx.plugins.pasta.method:annotate",
                     "llmx.plugins.pasta.config:AnnotateParams",
                     summary="Pasta-Lang SFT rows from the standard library: independent methods and functions "
                     "become <promise/><async> chunks with their token counts under the model's tokenizer.",
                     paper=PAPER)
    yield MethodSpec("pasta", (Stage.TRAIN,), "llmx.plugins.pasta.method:train", "llmx.plugins.pasta.config:PastaSFTParams",
                     summary="Pasta-SFT: fine-tune on annotated rows with the interpreter's attention masks and "
                     "positions (annotated: false: Baseline-SFT on the same rows, tags stripped).", paper=PAPER)
    yield MethodSpec("pasta", (Stage.DECODE,), "llmx.plugins.pasta.method:decode", "llmx.plugins.pasta.config:PastaDecodeParams",
                     aliases=("pasta-decode",),
                     summary="The Pasta-Lang interpreter: independent chunks decoded as parallel threads over one "
                     "interleaved KV cache; steps, theoretical speedup, parse rate, judge NLL.", paper=PAPER,
                     requires=("cupy",))
    yield MethodSpec("pasta-bonbon", (Stage.ALIGN,), "llmx.plugins.pasta.method:bonbon", "llmx.plugins.pasta.config:BonbonParams",
                     summary="BoNBoN rounds for Pasta: sample through the interpreter, score speedup + λ·quality, "
                     "train SFT on the best plus IPO best-vs-worst.", paper=PAPER)


# bench_pasta.py's budget: both fine-tunes of the base on the same annotated rows (4 epochs, batch 8, lr 1e-3, 5%
# warmup; a row past 384 tokens left out), then greedy decoding of the held-out prompts (the annotate stage's
# validation split: standard-library files neither fine-tune saw), 384 response tokens over every thread, each
# response's plain text judged by the base model (it saw neither fine-tune).
SFT = {"epochs": 4, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.05, "max_length": 384, "save": False}
DECODE = {"max_new_tokens": 384, "max_chunk_tokens": 256, "judge": "ref:llama-bench"}

# Full-attention models the interpreter has run on (its threads share one cache through attention masks).


def _arm(name: str, family: str, annotated: bool = True, **decode) -> Arm:
    # The decode stage by its alias: the runner looks a stage's params up by method name alone, which for "pasta"
    # finds the train stage's.
    return Arm(name, ({"method": "pasta-annotate", "params": {}},
                      {"method": "pasta", "stage": "train", "params": {**SFT, "annotated": annotated}},
                      {"method": "pasta-decode", "stage": "decode", "params": {**DECODE, **decode}}), family=family)


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="pasta",
        summary="Pasta-SFT decoded by the interpreter (predicted positions) against Baseline-SFT decoded "
                "sequentially, same rows and budget: the judge's per-token NLL of each held-out response (quality), "
                "against decode steps per response (the cost axis).",
        paper="Jin et al., ICML 2025: quality (AlpacaEval win rate against sequential decoding) against speedup of "
              "Pasta-Lang decoding, Baseline-SFT decoded sequentially",
        target="pasta-sft", baselines=("baseline-sft",),
        arms=(_arm("pasta-sft", "pasta"),
              _arm("baseline-sft", "sequential", annotated=False)),
        evaluation=None, items="prompts.jsonl", metric="judge_nll", higher_is_better=False,
        cost="decode steps per response", cost_key="steps_mean",
        seeds=(0, 1, 2), model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128}, corpus=False,
        kinds=ATTENTION_KINDS,
        quick={"limit": 80, "epochs": 0.02, "batch_size": 1, "max_length": 300, "max_new_tokens": 8,
               "judge": "ref:llama-test"},
        quick_model="ref:llama-test", quick_seeds=(0,))
