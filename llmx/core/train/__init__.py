"""Training: the shared loop (``loop``), its schedules, checkpoints and data parallelism, and the training stages
built on it: causal-LM training (``lm``), supervised fine-tuning (``sft``), preference alignment (``align``) and
LoRA adapters through PEFT (``adapters``). Importing this package never imports torch."""
