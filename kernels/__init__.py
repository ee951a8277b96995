"""Everything that touches MLX: loading, conversion, sampling, caches, drafters' forwards."""
