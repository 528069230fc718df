"""FEEDER (Jin et al., ICML 2025): pre-select the demonstrations that are sufficient and necessary for the model to
infer its pool, then run ICL or fine-tuning on that set.

There is no official code; every choice below is a reconstruction (notes §2.2) and an option:

- Ψ(C, x): the label word the model scores highest after ``C``'s rows and ``x`` in ``template`` (multi-token labels
  by summed log-probabilities), demonstrations in pool-index order; ``oracle: knn`` is a deterministic stand-in,
  ``oracle: copy`` the exact copier of an episode pool (the label of a demonstration with the query's cue).
- Sufficiency is per instance: A is sufficient for B when Ψ(A, x) = y for every (x, y) in B, with all of A in context.
- The tree pairs nodes at random per level; the parent is A, else B, else A ∪ B; ``depth`` levels (default: until
  one node); ``rounds`` > 1 runs the tree again on the previous round's set.
- The necessity pass visits members in random order and drops each one whose removal keeps the set's inferences
  (greedy, one pass); the optional repair pass adds uninferred pool rows at random up to the context, runs the
  necessity pass again, and is discarded when the repaired set infers fewer pool rows.
- ``max_node_size`` (default: as many of the pool's longest rows as fit the context) cuts a larger node: ``cut:
  random`` keeps a random order's rows while they fit, ``redundancy`` each row the kept ones do not infer; every cut
  is counted in the output (``truncations``; none with the default episode pool, which fits a 64-token context).
- The set is paired, per pool row, against random subsets of its size (``random_draws``): the share of them that
  infer the row against the set's inference, with a bootstrap interval (``core.eval.stats.paired``).
- Bi-level fine-tuning: ``outer_rounds`` of (select with the current model, fine-tune ``steps`` on in-context
  sequences: a selected row as the query, ``shots`` other selected rows as its demonstrations).
- The similarity selector of ``eval --method icl`` uses the model's mean last-layer hidden state of each input.
"""
