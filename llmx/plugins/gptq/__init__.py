"""GPTQ (Frantar et al., ICLR 2023): the baseline weight quantizer, Algorithm 1 with lazy block updates. The solver
is ``core.quant.gptq``, the block-by-block calibration ``core.quant.calibration.sequential``.

Deviations from the paper and the reference code (IST-DASLab/gptq), and the options around them:

- ``group_scale``: a non-static group's range is found when its first column comes up, from its columns as they
  stood when the current lazy block began (``block_start``, default: the reference's ``find_params(W[:, i:i+g])``),
  or as updated so far, the block's own updates included (``updated``, llmx's behaviour before issue 67). They differ
  only where a group starts mid-block (group size not a multiple of ``block_size``).
- ``true_sequential``: off by default, as in the paper's setup (a block's layer Hessians from one pass, then the
  block re-run quantized for the next one's inputs) and the reference llama.py's ``--true-sequential`` flag. On, a
  block's layers are quantized group by group, each group's Hessian from inputs through the block's quantized
  earlier groups; the groups are the layers that read one tensor, in call order (q/k/v, o, gate/up, down on a
  Llama), found by a probe call rather than by layer names. One block pass per group.
- ``propagate: fp`` (Hessians from the float model, as GuidedQuant's) beside the reference's ``quantized``.
- Act-order with groups forces static groups (``static_groups``), so every group stays a contiguous run of input
  channels in storage; the reference's dynamic act-order groups (a ``g_idx`` per column) are not offered.
- The symmetric grid is full range as the reference code (``grid: restricted`` optional); ``H = X X^T`` without the
  reference's ``2 / n`` (dampening is relative to ``mean(diag H)``, so the scale does not matter).
"""
