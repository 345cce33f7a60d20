import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def wheel_logs():
    """The real Darshan logs shipped inside the darshan wheel."""
    import darshan
    base = Path(os.path.dirname(darshan.__file__))
    logs = sorted(base.glob("**/*.darshan"))
    assert logs, "the darshan wheel ships example logs"
    return {p.name: p for p in logs}


@pytest.fixture(scope="session")
def trinity():
    from bbsim.machine import load_machine
    return load_machine("trinity")
