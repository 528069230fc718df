from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("lexico", (Stage.TRAIN,), "llmx.plugins.lexico.method:train", "llmx.plugins.lexico.config:LexicoTrainParams",
                     summary="Lexico: learn per-layer universal K/V dictionaries from the model's KV vectors.",
                     paper="Kim et al., ICML 2025 (arXiv 2412.08890)", requires=("cupy",))
    yield MethodSpec("lexico", (Stage.DECODE,), "llmx.plugins.lexico.method:decode",
                     "llmx.plugins.lexico.config:LexicoDecodeParams",
                     summary="Lexico: KV cache as sparse codes (OMP) over the dictionaries; quality and memory vs "
                     "the full cache.", paper="Kim et al., ICML 2025 (arXiv 2412.08890)", requires=("cupy",))
    yield MethodSpec("kivi", (Stage.DECODE,), "llmx.plugins.lexico.method:kivi", "llmx.plugins.lexico.config:KIVIParams",
                     summary="KIVI 2/4-bit KV cache quantization (baseline), measured like Lexico.",
                     paper="Liu et al., 2024 (baseline)")
    yield MethodSpec("kv-window", (Stage.DECODE,), "llmx.plugins.lexico.method:window", "llmx.plugins.lexico.config:WindowParams",
                     aliases=("streaming",), summary="Token eviction: keep attention sinks and a recent window "
                     "(baseline), measured like Lexico.", paper="Xiao et al., 2024 (baseline)")
