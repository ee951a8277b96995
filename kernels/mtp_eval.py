"""Acceptance of an MTP head by draft position, against the base model's own greedy continuation.

At width 1 and temperature 0 the tokens a speculative run emits are exactly the base's greedy
tokens, whatever is drafted, so acceptance can be measured by replay: run the base greedily once
(keeping h_t at every position), then at every emitted token let the head draft k_max tokens from
the exact pairs so far, as the drafter would, and compare them with what the base emitted next.
Position i counts as accepted when drafts 1..i all match (greedy verification accepts a prefix).

    report = measure_acceptance(model, head, prompts, k_max=4, max_tokens=128)
    report.by_position  -> (a1, a2, a3, a4)   # a_i = P(drafts 1..i all accepted)
Run `python -m kernels.mtp_eval --prompts tests/prompts/chat.jsonl` for a prompt set.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import kernels  # noqa: F401  (BLAS before mlx)
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from kernels.features import body, select
from kernels.loader import output_head
from kernels.mtp_data import Trace, chat_ids, generate_traces
from kernels.mtp_head import MTPHead


@dataclass(frozen=True)
class AcceptanceReport:
    k_max: int
    prompts: int
    accepted: tuple[int, ...]  # accepted[i]: draft steps whose drafts 1..i+1 all matched
    eligible: tuple[int, ...]  # eligible[i]: draft steps with at least i+1 tokens still to come

    @property
    def steps(self) -> int:
        return self.eligible[0] if self.eligible else 0

    @property
    def by_position(self) -> tuple[float, ...]:
        """a_i, the chance that drafts 1..i are all accepted, for i = 1..k_max."""
        return tuple(a / e if e else 0.0 for a, e in zip(self.accepted, self.eligible))

    def expected_accepted(self, k: int) -> float:
        """Mean drafts accepted per verify step when drafting k: a_1 + ... + a_k."""
        return float(sum(self.by_position[:k]))

    def as_dict(self) -> dict:
        return {"k_max": self.k_max, "prompts": self.prompts, "steps": self.steps,
                "accepted": list(self.accepted), "eligible": list(self.eligible),
                "by_position": [round(a, 4) for a in self.by_position],
                # tokens a verify step yields at each depth k: 1 + a_1 + ... + a_k
                "tokens_per_verify_by_k": [round(1 + self.expected_accepted(k), 4) for k in range(1, self.k_max + 1)]}


def measure_acceptance(
    model,
    head: MTPHead,
    prompts: Iterable[Sequence[int]],
    k_max: int,
    max_tokens: int,
    *,
    stop_ids: Iterable[int] = (),
    batch: int = 1,
) -> AcceptanceReport:
    """Acceptance by draft position of `head` on the base `model` (an mlx-lm model).

    prompts are token ids (already chat-templated); each runs greedily for up to max_tokens new
    tokens, ending early at a stop id. batch > 1 runs the base on several prompts at once
    (left-padded; same tokens, faster); drafting always replays one sequence at a time.
    """
    return measure_heads(model, [head], prompts, k_max, max_tokens, stop_ids=stop_ids, batch=batch)[0]


def measure_heads(model, heads: Sequence[MTPHead], prompts: Iterable[Sequence[int]], k_max: int,
                  max_tokens: int, *, stop_ids: Iterable[int] = (), batch: int = 1) -> list[AcceptanceReport]:
    """measure_acceptance for several heads over one greedy run of the base (the costly part)."""
    prompts = [list(p) for p in prompts]
    layers = tuple(sorted({n for head in heads for n in head.config.feature_layers}))
    accepted = [np.zeros(k_max, np.int64) for _ in heads]
    eligible = [np.zeros(k_max, np.int64) for _ in heads]
    for start in range(0, len(prompts), batch):
        traces = generate_traces(model, prompts[start : start + batch], max_tokens,
                                 set(stop_ids), hidden_dtype=mx.float32, layers=layers)
        for trace in traces:
            for n, head in enumerate(heads):
                a, e = replay(model, head, trace.tokens, head_input(head, trace, layers), trace.prompt_len, k_max)
                accepted[n], eligible[n] = accepted[n] + a, eligible[n] + e
    return [AcceptanceReport(k_max, len(prompts), tuple(a.tolist()), tuple(e.tolist()))
            for a, e in zip(accepted, eligible)]


def head_input(head: MTPHead, trace: Trace, stored: tuple[int, ...]) -> np.ndarray:
    """What the runtime feeds this head at each position of the trace: h_t, or its layers and h_t."""
    wanted = head.config.feature_layers
    if not wanted:
        return trace.hidden
    return np.concatenate([select(trace.features, stored, wanted, trace.hidden.shape[1]), trace.hidden], axis=1)


def replay(model, head: MTPHead, tokens: list[int], hidden: np.ndarray, prompt_len: int, k_max: int):
    """Draft k_max tokens at every emitted token of one greedy run; (accepted, eligible) counts.
    hidden [T, F]: the head's exact-pair input at each position (head_input)."""
    embed, final_norm, lm_head = model.model.embed_tokens, model.model.norm, output_head(model)
    h = mx.array(hidden)
    cache = head.make_cache()
    # The prompt's exact pairs (h_j, t_{j+1}) for j < P-1, as the drafter absorbs after prefill.
    head.absorb(h[: prompt_len - 1], tokens[1:prompt_len], embed, final_norm, cache)
    accepted, eligible = np.zeros(k_max, np.int64), np.zeros(k_max, np.int64)
    for t in range(prompt_len - 1, len(tokens) - 2):
        # tokens[t+1] was emitted from h_t; drafts guess tokens[t+2], tokens[t+3], ...
        drafted = head.draft(h[t], [tokens[t + 1]], k_max, embed, final_norm, lm_head, cache).ids
        upcoming = tokens[t + 2 : t + 2 + k_max]
        eligible[: len(upcoming)] += 1
        matched = 0
        while matched < len(upcoming) and drafted[matched] == upcoming[matched]:
            matched += 1
        accepted[:matched] += 1
    return accepted, eligible


def draft_ms(model, head: MTPHead, k: int, context: int = 128, repeats: int = 20) -> float:
    """Wall milliseconds of one drafting call (one new exact pair, then k drafts) after a
    context of `context` pairs: the drafter's cost per verify step on this machine."""
    embed, final_norm, lm_head = model.model.embed_tokens, model.model.norm, output_head(model)
    dim = head.config.feature_width  # an exact pair's input: a fused head's layers too
    hidden = mx.random.normal((context + 1, dim), key=mx.random.key(0))
    tokens = mx.random.randint(0, embed.weight.shape[0], (context + 1,), key=mx.random.key(1))
    cache = head.make_cache()
    head.absorb(hidden[:context], tokens[:context], embed, final_norm, cache)
    samples = []
    for _ in range(repeats + 2):  # the first two warm up
        started = time.perf_counter()
        head.draft(hidden[context], tokens[context:], k, embed, final_norm, lm_head, cache)
        samples.append(time.perf_counter() - started)
        for layer_cache in cache:
            layer_cache.trim(1)  # back to the same context each time
    return 1000 * float(np.median(samples[2:]))


def verify_ms(model, k: int, layers: tuple[int, ...], context: int = 128, repeats: int = 20) -> tuple[float, float]:
    """Median wall ms of one verify forward of k+1 rows after `context` tokens: (stock forward,
    the forward that also gives a fused head the outputs of `layers`), timed in turn so load hits both."""
    cache = make_prompt_cache(model)
    model(mx.arange(context, dtype=mx.uint32)[None] % 100, cache=cache)
    rows = mx.arange(k + 1, dtype=mx.uint32)[None]
    samples: dict[tuple, list[float]] = {(): [], **({tuple(layers): []} if layers else {})}
    for _ in range(repeats + 2):  # the first two warm up
        for chosen, times in samples.items():
            started = time.perf_counter()
            final, features = body(model, rows, cache, chosen)
            mx.eval(mx.argmax(output_head(model)(final), axis=-1), features)
            times.append(time.perf_counter() - started)
            for c in cache:
                c.trim(k + 1)
    medians = [1000 * float(np.median(t[2:])) for t in samples.values()]
    return medians[0], medians[-1]


def load_prompt_set(path: str | Path, tokenizer) -> list[list[int]]:
    """Token ids of a prompt set: JSON lines with a "prompt" (one user turn, chat-templated)."""
    lines = Path(path).read_text().splitlines()
    return [chat_ids(tokenizer, json.loads(line)["prompt"]) for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> None:
    from kernels.loader import load
    from kernels.mtp_data import DEFAULT_MODEL, eos_ids, load_tokenizer
    from kernels.mtp_head import load_mtp_head, shipped_head_dir, shrink_draft_vocab

    parser = argparse.ArgumentParser(description="MTP head acceptance by draft position")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--head", nargs="+", default=[str(shipped_head_dir())],
                        help="one or more heads, measured over the same base runs")
    parser.add_argument("--prompts", nargs="+", default=["tests/prompts/chat.jsonl", "tests/prompts/code.jsonl"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--draft-vocab", type=int, default=0, help="shrink the heads' vocabulary")
    parser.add_argument("--timing", action="store_true", help="also time drafting at k=1..K")
    args = parser.parse_args(argv)
    model, tokenizer = load(args.model).model, load_tokenizer(args.model)
    heads = [load_mtp_head(path) for path in args.head]
    if args.draft_vocab:
        heads = [shrink_draft_vocab(head, args.draft_vocab) for head in heads]
    if args.timing:
        for path, head in zip(args.head, heads):
            layers = head.config.feature_layers
            timing = {k: round(draft_ms(model, head, k), 2) for k in range(1, args.k + 1)}
            verify = {k: [round(ms, 2) for ms in verify_ms(model, k, layers)] for k in range(1, args.k + 1)}
            print(json.dumps({"head": path, "feature_layers": list(layers), "draft_ms_by_k": timing,
                              "verify_ms_by_k_plain_then_fed": verify}), flush=True)
    for path in args.prompts:
        reports = measure_heads(model, heads, load_prompt_set(path, tokenizer), args.k, args.max_tokens,
                                stop_ids=eos_ids(tokenizer, args.model), batch=args.batch)
        for head_path, report in zip(args.head, reports):
            print(json.dumps({"set": Path(path).stem, "head": head_path, **report.as_dict()}), flush=True)


if __name__ == "__main__":
    main()
