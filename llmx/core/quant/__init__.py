"""Shared quantization primitives (formats, RTN); papers' plugins build on these."""
