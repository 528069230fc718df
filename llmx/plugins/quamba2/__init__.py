"""Quamba2 (Chiang et al., ICML 2025, arXiv 2503.22879): W8A8 / W4A8 / W4A16 for Mamba2 and Mamba, with the
Quamba1 recipe and naive per-tensor scales as baselines in the same method (``recipe``).

Deviations from the official code (``enyac-group/Quamba``), each an option where one exists:

- calibration 32 x 256 tokens of the run's data (``calib_samples``, ``calib_seq_len``; official 512 x 512 for the
  scales and 128 x 1024 WikiText tokens for GPTQ, which here reuses the same windows);
- the embedding stays in float unless ``quantize_embedding`` (the official flag; int4 RTN rows here);
- GPTQ's Hessians see the already-installed int8 points;
- the SSM runs as fake-quant around a float32 scan (the cached decode state int8-rounded, held in float);
- the channel clustering (Sec. 4.1; k-means over each sorted channel position's unit-norm values in every head of
  the head group, as the official code) runs Lloyd's to convergence (official: scikit-learn's default tolerance,
  which can stop a few positions earlier) and makes its labels monotone where the official code asserts they are;
  ``cluster_features: mean_profile`` clusters the head group's mean sorted profile instead (1-D; llmx before
  issue 67).
"""
