"""CROW (Min et al., ICML 2025): backdoor removal by fine-tuning with an adversarial layer-consistency regulariser,
``llmx train --method crow`` (the ``sft`` stage with CROW's objective).

Defaults are the official trainer's (``consistency_trainer.compute_loss`` and its LoRA configs): eps 0.1, alpha
5.5, LoRA r 8 / alpha 16 on every linear layer, lr 1e-3, 5 epochs, batch 2 x 4. What changed (issue 68), to match it:

* a step's micro-batches weigh equally (HF's Trainer of transformers <= 4.43, which the official code pins; was: by
  their completion tokens, the shared loop's default), each its LM mean over its completion tokens plus alpha times
  its consistency mean;
* the consistency mean counts every position of the micro-batch, prompt and padding, as the official (no attention
  mask), with the official collator's right padding to a multiple of 8 (``pad_to_multiple_of: 8``, new; 1: to the
  longest row). ``mask_padding: true`` leaves padding out (an option, not the official).
"""
