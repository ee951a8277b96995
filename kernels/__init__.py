"""Everything that touches MLX: loading, conversion, sampling, caches, drafters' forwards."""

from runtime.blas import select_blas

# Importing any kernel module picks the BLAS first: MLX binds its BLAS symbols at import.
BLAS = select_blas()
