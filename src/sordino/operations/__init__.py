"""Operator tools: live configuration changes, strategy bundles, hints embedded in models.

Pure logic over configuration documents and files; the server (``server/reconfigure.py``)
and the CLI (``cli/reconfigure.py``, ``cli/strategy.py``, ``cli/hints.py``) are the
shells around it. docs/operations.md is the guide.
"""
