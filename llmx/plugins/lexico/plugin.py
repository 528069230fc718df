from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Kim et al., ICML 2025 (arXiv 2412.08890)"


@hookimpl
def llmx_methods():
    yield MethodSpec("lexico", (Stage.TRAIN,), "llmx.plugins.lexico.method:train", "llmx.plugins.lexico.config:LexicoTrainParams",
                     summary="Lexico: learn per-layer universal K/V dictionaries from the model's KV vectors.",
                     paper=PAPER, requires=("cupy",))
    yield MethodSpec("lexico", (Stage.DECODE,), "llmx.plugins.lexico.method:decode",
                     "llmx.plugins.lexico.config:LexicoDecodeParams", aliases=("lexico-decode",),
                     summary="Lexico: KV cache as sparse codes (OMP) over the dictionaries; quality and memory vs "
                     "the full cache.", paper=PAPER, requires=("cupy",))
    yield MethodSpec("kivi", (Stage.DECODE,), "llmx.plugins.lexico.method:kivi", "llmx.plugins.lexico.config:KIVIParams",
                     summary="KIVI 2/4-bit KV cache quantization (baseline), measured like Lexico.",
                     paper="Liu et al., 2024 (baseline)")
    yield MethodSpec("kv-window", (Stage.DECODE,), "llmx.plugins.lexico.method:window", "llmx.plugins.lexico.config:WindowParams",
                     aliases=("streaming",), summary="Token eviction: keep attention sinks and a recent window "
                     "(baseline), measured like Lexico.", paper="Xiao et al., 2024 (baseline)")


# Every arm decodes the same held-out windows (the validation split: the dictionaries learn on the train split) with
# the official 128-token exact buffer; compressed tokens leave it 32 at a time (the cache config's
# approximation_length). 960 prefilled + 64 decoded tokens: ref:llama-long's 1024-token training length.
EVAL = {"windows": 16, "context_len": 960, "continuation_len": 64, "generate_tokens": 16, "recall_tokens": 16,
        "recall_cue": 32, "buffer_length": 128, "chunk": 32}
# bench_lexico.py's dictionaries: 1024 atoms (official 4096 at head_dim 128; head_dim is 64 here), 3000 cosine-annealed
# Adam steps on 16 training windows of 1024 tokens.
DICTIONARY = {"atoms": 1024, "steps": 3000, "lr": 5e-3, "windows": 16, "seq_len": 1024, "held_out_windows": 4}
# A ref:llama-long KV vector is 64 fp16 channels, 128 bytes: Lexico s=8 stores 8 int16 ids + 8 fp8 coefficients (24
# bytes), KIVI-2 2-bit codes (16) + an fp16 scale and zero per 32 tokens per key channel and per 32 value channels (8),
# KIVI-4 48. A window keeping 4 sinks + 317 recent tokens of the 1023 cached stores what Lexico s=8 does (31%: 864
# tokens compressed, 159 exact).
WINDOW = 317
# Models whose attention the compressed caches and the codes-reading attention run on (not attention-free ones).
KV_KINDS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "opt", "gpt2", "phi3")


def _lexico(s: int) -> tuple[dict, ...]:
    # The decode stage by its alias: the runner looks a stage's params up by method name alone, which for "lexico"
    # finds the train stage's.
    return ({"method": "lexico", "stage": "train", "params": {**DICTIONARY, "sparsity": s}},
            {"method": "lexico-decode", "stage": "decode", "params": {**EVAL, "attention": "codes"}})


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="lexico",
        summary="Lexico s=8 (dictionaries learned per seed) against KIVI-2 and a sink+window cache storing the same "
                "KV bytes, and KIVI-4, matched once the dictionaries are counted: KL to the full cache per held-out "
                "window.",
        paper="Kim et al., ICML 2025: Lexico against KIVI 2/4-bit and token eviction at equal KV size % (GSM8K, "
              "LongBench accuracy; here KL to the full cache on held-out text)",
        target="lexico-s8", baselines=("kivi-2bit", "window", "kivi-4bit"),
        arms=(Arm("lexico-s8", _lexico(8)),
              Arm("kivi-2bit", ({"method": "kivi", "params": {**EVAL, "bits": 2, "group": 32}},)),
              Arm("window", ({"method": "kv-window", "params": {**EVAL, "window": WINDOW, "sinks": 4}},)),
              Arm("kivi-4bit", ({"method": "kivi", "params": {**EVAL, "bits": 4, "group": 32}},)),
              Arm("lexico-s4", _lexico(4))),
        evaluation=None, items="windows.jsonl", metric="kl_to_full", higher_is_better=False,
        cost="KV memory / fp16 cache (dictionaries over 8 sequences)", cost_key="kv_memory_fraction_amortised",
        seeds=(0, 1, 2), model="ref:llama-long", data={"source": "stdlib", "seq_len": 1024}, kinds=KV_KINDS,
        quick={"atoms": 64, "steps": 10, "windows": 2, "seq_len": 64, "held_out_windows": 1, "context_len": 48,
               "continuation_len": 8, "generate_tokens": 2, "recall_cue": 8, "recall_tokens": 2, "buffer_length": 8,
               "chunk": 8, "group": 8, "window": 12},
        quick_model="ref:llama-test", quick_seeds=(0,))
