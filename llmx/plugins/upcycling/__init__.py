"""Sparse upcycling and its scaling law (Liew, Kato, Takase, ICML 2025): dense to MoE through the shared LM stage
(``train --method upcycle``) and the law's fit with budget guidance (``analyze --method upcycling-law``)."""
