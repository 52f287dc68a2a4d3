"""Triton's Python backend in sordino: ``model.py`` models and ``triton_python_backend_utils``."""
