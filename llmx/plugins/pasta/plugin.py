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
                     summary="The Pasta-Lang interpreter: independent chunks decoded as parallel threads over one "
                     "interleaved KV cache; steps, theoretical speedup, parse rate, judge NLL.", paper=PAPER,
                     requires=("cupy",))
    yield MethodSpec("pasta-bonbon", (Stage.ALIGN,), "llmx.plugins.pasta.method:bonbon", "llmx.plugins.pasta.config:BonbonParams",
                     summary="BoNBoN rounds for Pasta: sample through the interpreter, score speedup + λ·quality, "
                     "train SFT on the best plus IPO best-vs-worst.", paper=PAPER)
