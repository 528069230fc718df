from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.pasta.config import AnnotateParams

PAPER = "Jin et al., ICML 2025 (PMLR 267:27941-27956)"


@hookimpl
def llmx_methods():
    yield MethodSpec("pasta-annotate", (Stage.ANALYZE,), "llmx.plugins.pasta.method:annotate", AnnotateParams,
                     summary="Pasta-Lang SFT rows from the standard library: independent methods and functions "
                     "become <promise/><async> chunks with their token counts under the model's tokenizer.",
                     paper=PAPER)
