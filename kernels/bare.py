"""A bare mlx-lm generate loop, the baseline the runtime is measured against (metrale bench parity)."""

from __future__ import annotations

import time

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.generate import generate_step

from kernels.loader import load


class BareGenerator:
    def __init__(self, model_dir):
        self.model = load(model_dir).model

    def greedy(self, prompt_ids: list[int], max_tokens: int, eos_ids) -> tuple[list[int], float]:
        """Tokens up to EOS or max_tokens, and the wall seconds from the call to the last token."""
        started = time.perf_counter()
        out = []
        for token, _ in generate_step(mx.array(prompt_ids), self.model, max_tokens=max_tokens):
            token = int(token)
            if token in eos_ids:
                break
            out.append(token)
        return out, time.perf_counter() - started
