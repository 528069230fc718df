"""Lexico (Kim et al., ICML 2025, arXiv 2412.08890): universal K/V dictionaries and a KV cache of sparse codes; KIVI
(Liu et al., 2024) and a sink + window cache (Xiao et al., 2024) as baselines measured the same way.

Options, and where llmx departs from the official code:

- ``buffer`` (exact recent tokens): ``official`` (default) keeps them as each method's code does. Lexico
  (``LexicoCache.update``) compresses the oldest ``chunk`` (approximation_length) once ``buffer_length`` are exact:
  97-128 exact at 128 and 32. KIVI (``LlamaAttention_KIVI``) quantizes keys a residual of ``buffer_length`` at a time
  (0 to R-1 exact) and values as they leave the last R (R exact). ``at_least`` is llmx's earlier rule for both:
  ``buffer_length`` to ``buffer_length + chunk - 1`` exact (128-159), in whole KIVI key groups.
- ``attention``: ``codes`` (default, Lexico and KIVI) attends over the compressed tokens without rebuilding them:
  Lexico's scores gathered from ``q D_k`` and values formed in atom space (Sec. 3.3); KIVI's keys and values
  dequantized a block of tokens at a time, in PyTorch (not KIVI's fused CUDA kernels). ``dense`` rebuilds them per
  layer: the reference both are tested against.
- KIVI's per-channel key groups leave padding out of their min and max when the cache is given the prompt's
  attention mask (``CompressedCache(padding=...)``); the official code includes it. Group boundaries are shared by
  the batch, so a left-padded row equals its sequence alone when the padding is whole residuals.
- The record of codes handed to attention and not yet read is each cache's own (an error at its next update), not
  process-wide: models decode interleaved in one process.
- Memory counts the dictionaries per sequence and amortised over ``amortize_batch`` (8) sequences; ``llmx compare
  lexico`` matches on the amortised figure and sizes its window arm to it (``plugin.window_like_lexico``). Step
  time is each window's beside the full cache's on the same window.
- Fixed ``s`` per vector: no CSR row pointers (3s bytes per vector), and ``tol`` saves no bytes. Dictionaries are held
  in the model's dtype (official: fp16). ``chunk`` defaults to at most ``buffer_length`` (the official code refuses
  more); KIVI's ``group`` defaults to 32, or to its largest divisor that divides an official residual 32 does not.
"""
