"""Evaluation helpers shared by the eval methods, the tasks and the zoo: language-model scoring (``lm``), generation
with stop strings (``generate``), continuation scoring (``score``), answers (``answers``), statistics (``stats``), the
sandbox for generated code (``sandbox``) and the task runner (``tasks``)."""
