"""PIPA (Li, Wang, Liu; ICML 2025): preference alignment as prior-informed MLE, ``llmx align --method pipa``.

Defaults and what changed (issue 68):

* ``pair_mode: independent`` (default since issue 68; was ``conditional``): a pair is two labelled samples
  ``(y_w, c=1)``, ``(y_l, c=0)`` with ``g`` learned, the paper's method. ``conditional`` conditions on exactly one
  positive; for PIPA-N ``g`` cancels and it is DPO with ``beta`` (DPO-equivalent, the paper's special case).
  Every result records ``pair_mode`` in the stage's metrics.
* ``m_stabilizer: penalty`` (default since issue 68; was ``clamp``): PIPA-M's ``log q`` clamped at ``clamp_logq``
  plus the exact penalty on a violated ``f g <= p0``; the loss is unchanged inside the bound and a row past it
  keeps a gradient. ``clamp`` (no gradient past the bound) and ``softplus`` (``q = sigmoid(u)``) are options.
* ``variant: n``, ``beta: 1.0`` (conditional PIPA-N only), ``clamp_logq: -1e-6``; no official code, so every
  derived piece is an option (``llmx.core.preference``).
"""
