"""PASTA (Jin et al., ICML 2025): Pasta-Lang tags let a model promise semantically independent chunks that an
interpreter decodes asynchronously. There is no official code; the tag language (``lang``) and the program-annotated
standard-library data (``annotate``) are llmx's reconstruction (notes §2, §7).
"""
