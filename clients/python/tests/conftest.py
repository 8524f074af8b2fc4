import pytest

from runkeep.testing import Serve


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    yield s
    s.close()
