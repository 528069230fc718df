"""FEEDER (Jin et al., ICML 2025): pre-select the demonstrations that are sufficient and necessary for the model to
infer its pool, then run ICL or fine-tuning on that set.

There is no official code; every choice below is a reconstruction (notes §2.2) and an option:

- Ψ(C, x): the label word the model scores highest after ``C``'s rows and ``x`` in ``template`` (multi-token labels
  by summed log-probabilities), demonstrations in pool-index order; ``oracle: knn`` is a deterministic stand-in.
- Sufficiency is per instance: A is sufficient for B when Ψ(A, x) = y for every (x, y) in B, with all of A in context.
- The tree pairs nodes at random per level; the parent is A, else B, else A ∪ B; ``depth`` levels (default: until
  one node); ``rounds`` > 1 runs the tree again on the previous round's set.
- The necessity pass visits members in random order and drops each one the rest still infers (greedy, one pass); the
  optional repair pass adds uninferred pool rows at random up to the context.
- ``max_node_size`` (default: as many of the pool's longest rows as fit the context) keeps a random subset of a larger
  node; every cut is counted in the output.
- Bi-level fine-tuning: ``outer_rounds`` of (select with the current model, fine-tune ``steps`` on in-context
  sequences: a selected row as the query, ``shots`` other selected rows as its demonstrations).
- The similarity selector of ``eval --method icl`` uses the model's mean last-layer hidden state of each input.
"""
