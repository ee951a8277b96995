"""Shared test set-up: the BLAS is chosen before any test module imports mlx, and every server and
system the tests start keeps what it learns (cost tables, prompt-cache files) in a private cache
folder, never in the user's: a table learned on a loaded test machine would be the next real
server's prior."""

import os
import shutil
import tempfile
from pathlib import Path

import kernels  # noqa: F401
from kernels.default_model import cache_dir


def pytest_configure(config) -> None:
    real = cache_dir()
    private = Path(tempfile.mkdtemp(prefix="metrale-test-cache-"))
    (real / "models").mkdir(parents=True, exist_ok=True)
    (private / "models").symlink_to(real / "models")  # the fetched default model, shared read-only
    os.environ["METRALE_CACHE"] = str(private)
    config._metrale_cache = private


def pytest_unconfigure(config) -> None:
    private = getattr(config, "_metrale_cache", None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
