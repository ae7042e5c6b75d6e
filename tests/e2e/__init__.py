# A package, so that this folder's conftest is imported as ``e2e.conftest``
# and does not shadow ``tests/conftest.py`` (the tool's tests import names
# from ``conftest``).
