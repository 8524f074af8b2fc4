"""CI tests the packages as installed from the built wheels
(``scripts/ci.sh`` sets ``RUNKEEP_TEST_INSTALLED=1``): every import must
come from the venv's site-packages, so a source path leaking onto
``sys.path`` (``PYTHONPATH=src``, an editable install) fails here instead
of passing the suites against files no user gets."""

from __future__ import annotations

import os
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

INSTALLED = os.environ.get("RUNKEEP_TEST_INSTALLED") == "1"
pytestmark = pytest.mark.skipif(not INSTALLED, reason="run from the source tree: scripts/ci.sh runs this against the built wheels")


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def test_runkeep_and_the_saver_are_imported_from_the_venv_s_site_packages():
    import langgraph.checkpoint.runkeep as saver

    import runkeep

    site = site_packages()
    assert Path(sys.prefix).resolve() in site.parents
    for module in (runkeep, saver):
        where = Path(module.__file__).resolve()
        assert site in where.parents, f"{module.__name__} imported from {where}, not from {site}"


def test_the_installed_distributions_are_ours_with_their_type_markers():
    client = metadata.distribution("runkeep-client")
    saver = metadata.distribution("langgraph-checkpoint-runkeep")
    files = {str(f) for f in client.files or []} | {str(f) for f in saver.files or []}
    assert "runkeep/py.typed" in files and "langgraph/checkpoint/runkeep/py.typed" in files
    assert any(r.startswith("runkeep-client") for r in saver.requires or []), saver.requires
    # No console script: `runkeep` is the server's command.
    assert not [e for e in client.entry_points if e.group == "console_scripts"]
    assert not [e for e in saver.entry_points if e.group == "console_scripts"]
    # PyPI's unrelated `runkeep` is not what got installed.
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("runkeep")
