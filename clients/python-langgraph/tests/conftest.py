import pytest

from runkeep.testing import Serve


@pytest.fixture(scope="session")
def serve():
    s = Serve()
    yield s
    s.close()
