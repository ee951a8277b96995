"""A bare mlx-lm generate loop, the baseline the runtime is measured against (metrale bench parity)."""

from __future__ import annotations

import time

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
from mlx_lm.generate import generate_step

from kernels.loader import load


class BareGenerator:
    def __init__(self, model_dir):
        self.model = load(model_dir, rows_kernel=False, compiled=False).model  # mlx-lm as it ships

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


class BatchGeneratorRunner:
    """mlx-lm's own continuous batching (BatchGenerator), the baseline of `metrale bench batch`."""

    def __init__(self, model_dir, eos_ids):
        self.model = load(model_dir, rows_kernel=False, compiled=False).model  # mlx-lm as it ships
        self.eos_ids = list(eos_ids)

    def run(self, prompts: list[list[int]], max_tokens: int):
        from mlx_lm.generate import BatchGenerator

        from runtime.bench.serving import timing

        generator = BatchGenerator(self.model, max_tokens=max_tokens, stop_tokens=[[t] for t in self.eos_ids],
                                   completion_batch_size=max(32, len(prompts)))
        started = time.perf_counter()
        uids = generator.insert(prompts, max_tokens=[max_tokens] * len(prompts))
        last_seen, gaps, tokens, open_uids = {}, [], 0, set(uids)
        while open_uids:
            for response in generator.next_generated():
                now = time.perf_counter()
                if response.uid in last_seen:
                    gaps.append(now - last_seen[response.uid])
                last_seen[response.uid] = now
                if response.finish_reason is None or response.token not in self.eos_ids:
                    tokens += 1
                if response.finish_reason is not None:
                    open_uids.discard(response.uid)
        seconds = time.perf_counter() - started
        generator.close() if hasattr(generator, "close") else None
        return timing(tokens, seconds, gaps)
