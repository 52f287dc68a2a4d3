"""Triton's example models (sordino start --with-triton-examples)."""
