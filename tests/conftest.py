"""Shared fixtures: the backends that can run here."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from cgvm.backend import available_backends  # noqa: E402

BACKENDS = available_backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
