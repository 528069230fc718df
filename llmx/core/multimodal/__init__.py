"""Vision-language support: synthetic digit scenes with ground truth, their text in six languages, LLaVA-format
conversations and multimodal batches, and the tiny LLaVA model (``ref:llava``) built from them."""
