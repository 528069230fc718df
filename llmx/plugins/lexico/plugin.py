from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.lexico.buffers import LexicoRule

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
# each method's official exact buffer (Lexico: 128 tokens, 32 leaving at a time, so 97-128 exact; KIVI: residual 128,
# keys 0-127 exact, values 128), attending over the compressed tokens without rebuilding them. 960 prefilled + 64
# decoded tokens: ref:llama-long's 1024-token training length. Dictionaries are counted over 8 sequences.
EVAL = {"windows": 16, "context_len": 960, "continuation_len": 64, "generate_tokens": 16, "recall_tokens": 16,
        "recall_cue": 32, "buffer_length": 128, "chunk": 32, "amortize_batch": 8}
# bench_lexico.py's dictionaries: 1024 atoms (official 4096 at head_dim 128; head_dim is 64 here), 3000 cosine-annealed
# Adam steps on 16 training windows of 1024 tokens.
DICTIONARY = {"atoms": 1024, "steps": 3000, "lr": 5e-3, "windows": 16, "seq_len": 1024, "held_out_windows": 4}
HEAD_DIM, KV_HEADS, DICT_BYTES = 64, 2, 4  # ref:llama-long's KV heads; float32 dictionaries (the runs' dtype)
SINKS = 4
# On that axis: Lexico s=8 0.288 of the fp16 cache + 0.125 of dictionaries; the window 423 of 1023 tokens, 0.413;
# KIVI-4 (40 bytes per compressed 128-byte vector: 4-bit codes, an fp16 scale and zero per 32 tokens or channels)
# 0.398; KIVI-2 (24 bytes, Lexico s=8's without dictionaries) 0.289. The quick form is matched to none of them.


def window_like_lexico(s: int) -> int:
    """Recent tokens a window with ``SINKS`` sinks keeps to store what Lexico s does with its dictionaries counted (the
    cost axis), after ``EVAL``'s prefill and decode steps, in full-cache tokens (every layer alike): a compressed token
    is ``3s / (2 HEAD_DIM)`` of one (s int16 ids + s fp8 coefficients per vector, against 2 HEAD_DIM fp16 bytes), an
    exact one 1, and the dictionaries ``atoms DICT_BYTES / (2 KV_HEADS)`` over ``amortize_batch`` (the 1 KiB fp8 table
    aside). Lexico s=8 on ref:llama-long: 896 tokens compressed (168), 127 exact, dictionaries 128: 423 of 1023."""
    rule = LexicoRule(EVAL["buffer_length"], EVAL["chunk"])
    compressed = rule(0, 0, EVAL["context_len"], True)[0]
    exact = EVAL["context_len"] - compressed
    for _ in range(EVAL["continuation_len"] - 1):  # the last token is scored, never cached
        moved = rule(exact, exact, 1, False)[0]
        compressed, exact = compressed + moved, exact + 1 - moved
    dictionaries = DICTIONARY["atoms"] * DICT_BYTES / (2 * KV_HEADS) / EVAL["amortize_batch"]
    return round(compressed * 3 * s / (2 * HEAD_DIM) + exact + dictionaries) - SINKS


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
        summary="Lexico s=8 (dictionaries learned per seed, counted over 8 sequences) against a sink+window cache "
                "and KIVI-4 storing about as much, and KIVI-2 storing Lexico's codes' bytes without its dictionaries "
                "(judged unmatched: 30% less memory, beyond the 10% tolerance): KL to the full cache per held-out "
                "window.",
        paper="Kim et al., ICML 2025: Lexico against KIVI 2/4-bit and token eviction at equal KV size % (GSM8K, "
              "LongBench accuracy; here KL to the full cache on held-out text)",
        target="lexico-s8", baselines=("kivi-2bit", "window", "kivi-4bit"),
        arms=(Arm("lexico-s8", _lexico(8)),
              Arm("kivi-2bit", ({"method": "kivi", "params": {**EVAL, "bits": 2, "group": 32}},)),
              Arm("window", ({"method": "kv-window", "params": {**EVAL, "window": window_like_lexico(8),
                                                                 "sinks": SINKS}},)),
              Arm("kivi-4bit", ({"method": "kivi", "params": {**EVAL, "bits": 4, "group": 32}},)),
              Arm("lexico-s4", _lexico(4))),
        evaluation=None, items="windows.jsonl", metric="kl_to_full", higher_is_better=False,
        cost="KV memory / fp16 cache (dictionaries over 8 sequences)", cost_key="kv_memory_fraction_amortised",
        tolerance=0.1, relative=True,
        seeds=(0, 1, 2), model="ref:llama-long", data={"source": "stdlib", "seq_len": 1024}, kinds=KV_KINDS,
        quick={"atoms": 64, "steps": 10, "windows": 2, "seq_len": 64, "held_out_windows": 1, "context_len": 48,
               "continuation_len": 8, "generate_tokens": 2, "recall_cue": 8, "recall_tokens": 2, "buffer_length": 8,
               "chunk": 8, "group": 8, "window": 12},
        quick_model="ref:llama-test", quick_seeds=(0,))
