"""``import triton_python_backend_utils`` in a process a Python model starts.

Triton's stub puts its backend folder on ``sys.path``, so a process the model starts
with ``multiprocessing``'s spawn or forkserver (which import the model's module again,
by name, with the parent's ``sys.path``) can import the utilities too. A sordino worker
puts this folder there (``backends/python/backend.py``); this module then stands for
sordino's own.
"""

import sys

from sordino.backends.python import triton_python_backend_utils

sys.modules[__name__] = triton_python_backend_utils
