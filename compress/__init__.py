"""compress: turn a big BERT into small, fast, measured students.

The stages are importable functions (``compress.core``, ``teacher``, ``students``,
``eval``); ``compress.cli`` is the thin command-line shell around them.
"""

import logging as _logging

__version__ = "0.1.0"

# torchao (pulled in by neural-compressor) tries to load CUDA kernels on import and
# torch's pytree registry warns about its enums; both are noise on every CPU run.
_logging.getLogger("torchao").setLevel(_logging.ERROR)
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
