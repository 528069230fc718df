"""RePer: perception in reflection (Wei et al., ICML 2025, arXiv 2504.07165). A policy LVLM answers, a critic scores
the answer and says what is wrong, the policy answers again given the whole dialogue (``turns``); reflective
perceptual learning trains it on dialogues ordered worst to best with the reflective unlikelihood loss (``loss``):
likelihood weighted by the turn reward sigma_t, unlikelihood by alpha (1 - sigma_t).

No official code is public (the repository holds a README), so every interpretation is an option:

- ``granularity: token`` (default, derived: unlikelihood per token, log(1 - p) clamped at eps, averaged over each
  response, every token but the EOS the best answer shares; ``reduction: sum``) or ``sequence`` (the formula as
  written);
- ``sigma: linear`` (t/T, the README's "rising linearly"), ``score`` or ``data``; ``alpha`` 8 (the ablation's best
  region; not stated); ``ul_tokens: differing`` (derived);
- the dialogue builder's ``min_score`` (6) and its turn count per image (drawn by ``turn_weights``) are not public;
  answers are chosen worst, nearest the midpoint, best;
- dialogues over ``max_length`` lose their earliest answers with the feedback after each;
- the ``rule`` critic reads the generated scene's ground truth: a stand-in for GPT-4o / LLaVA-Critic, with a
  10-point rubric of our own (hallucinated digit 4, wrong attribute 3, miss 2, relation 1, unreadable sentence 1;
  1 for a caption naming no object) and a templated rationale (``feedback: kind``: only the errors' kinds, no
  object named); ``noise`` is the weaker critic; ``critic: model``
  asks any LVLM with that rubric;
- at inference a prompt over the context loses its earliest answers, as in training;
- the ``lipo`` baseline's labels (each answer's win rate in its dialogue by the critic's score) and context (each
  answer to the question alone, as ``dpo``): the paper's LiPO setup is not public.
"""
