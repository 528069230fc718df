"""The preference baselines: DPO, IPO, SimPO on paired rows and KTO on unpaired rows (``llmx align --method ...``).

Defaults and what changed (issue 68):

* KTO's reference point ``reference_point: mismatched`` (default since issue 68; was the batch's own completions):
  TRL's KL term, each prompt with another row's completion (completions shifted by one row of the first epoch's
  order), ``max(0, mean(log pi(y'|x) - log ref(y'|x)))``, detached, its sum and count all-reduced over the ranks;
  it costs a gradient-free forward of policy and reference. ``batch_self`` is the old estimate, an option.
* IPO on per-token mean log-probs as TRL (``length_normalize: false``: the paper's sums); DPO's
  ``label_smoothing`` is conservative DPO.
"""
