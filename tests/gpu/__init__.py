# A package, so that this folder's conftest.py is imported as gpu.conftest and never shadows tests/conftest.py
# (test modules do `from conftest import descendants`).
