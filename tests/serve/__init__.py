"""Tests that need the serve extra (PyTriton, tritonclient, numpy < 2): run in .venv-serve by `make test-serve`."""
