"""Fixtures of the command-line tests.

- `nginx`, `s3`: the real nginx and moto S3 server of tests/io/conftest.py (on 127.0.0.1), for the tests that
  give the command line URLs; one definition, loaded from that file rather than copied.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

_IO_CONFTEST = Path(__file__).parents[1] / "io" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_lazyweights_io_conftest", _IO_CONFTEST)
assert _spec is not None and _spec.loader is not None
_io = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_io)

nginx = _io.nginx
s3 = _io.s3
free_port = _io.free_port
