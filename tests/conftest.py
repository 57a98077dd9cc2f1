import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

# one intra-op thread per pytest-xdist worker (make test runs two on two cores), at most two otherwise
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, as ``make test`` runs): the tests of a module that share a
    module-scoped fixture (an export made once for them) run in one worker, so the fixture is built once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = [name for name, defs in (info.name2fixturedefs.items() if info else ()) if defs and defs[-1].scope == "module"]
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
