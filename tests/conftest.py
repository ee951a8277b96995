"""Shared test set-up: the BLAS is chosen before any test module imports mlx."""

import kernels  # noqa: F401
