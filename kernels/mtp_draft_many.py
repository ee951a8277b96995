"""Drafts for several sequences in one MTP-head forward per depth: the head's weights read once.

A head forward is bound by reading its weights (~30 MB in float32 for the default model's head), and
one sequence's draft reads them once per depth; a batch step's drafts read them once per sequence
per depth. Here the rows of every sequence (its pending exact pairs, then one row per depth) go
through the head's products together, each row a batch element of one token with its own RoPE
position, and only the attention runs per sequence, against that sequence's own head cache. Every row
is computed as in MTPHead.draft, so each sequence's drafts are its own (within float tolerance of the
products; tests/unit/test_draft_many.py).

Rows are padded to a power of two so the compiled parts (kernels/compiled_blocks.py) trace a few shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx

from kernels.compiled_blocks import CompiledMTPBlock, _attention, _graphs, _parts
from kernels.mtp_head import MTPBlock, MTPDraft, MTPHead
from kernels.sampling import greedy, probs_from_logits, sample, top1_logprob


@dataclass
class DraftJob:
    """One sequence's draft: its new exact pairs (hidden [L, F], tokens [L]), depth k, its head cache,
    and how it samples (temperature 0: greedy; key: its draft key at temperature > 0)."""

    hidden: mx.array
    tokens: mx.array
    k: int
    cache: list
    temperature: float = 0.0
    top_p: float = 1.0
    key: mx.array | None = None


def batchable(head: MTPHead) -> bool:
    """Whether the head's block can run row-batched: the llama form compiled_blocks knows."""
    block = head.layers[0]
    attn = block.self_attn
    return type(block) in (MTPBlock, CompiledMTPBlock) and not attn.gated and "q_norm" not in attn


def draft_many(head: MTPHead, jobs: list[DraftJob], embed, final_norm, lm_head) -> list[MTPDraft]:
    """Each job's k drafts, as MTPHead.draft would give them, evaluated once for all."""
    if any(j.k < 1 or j.tokens.size < 1 for j in jobs):
        raise ValueError("draft_many needs k >= 1 and a new pair for every sequence")
    keys = [list(mx.random.split(j.key, j.k)) if j.key is not None else None for j in jobs]
    x = _forward(head, [j.hidden for j in jobs], [j.tokens.reshape(-1) for j in jobs], [j.cache for j in jobs],
                 embed, final_norm, exact=True)
    live, depths, probs = list(range(len(jobs))), [], [[] for _ in jobs]
    for depth in range(max(j.k for j in jobs)):
        logits = head.draft_logits(x, lm_head)  # [live, V']
        ids = head._full_ids(greedy(logits))
        sampled = [row for row, n in enumerate(live) if jobs[n].temperature > 0]
        if sampled:  # rows at temperature > 0 draw from q, which rejection sampling needs
            picks = [ids[row:row + 1] for row in range(len(live))]
            for row in sampled:
                job = jobs[live[row]]
                probs[live[row]].append(head._full_probs(probs_from_logits(logits[row], job.temperature, job.top_p)))
                picks[row] = sample(probs[live[row]][-1], keys[live[row]][depth]).reshape(1)
            ids = mx.concatenate(picks)
        depths.append((live, ids, top1_logprob(logits)))
        going = [row for row, n in enumerate(live) if depth + 1 < jobs[n].k]
        if not going:
            break
        chosen = mx.array(going)
        live = [live[row] for row in going]
        x = _forward(head, [x[chosen]], [ids[chosen]], [jobs[n].cache for n in live], embed, final_norm,
                     exact=False, one_row_each=True)
    for job in jobs:  # only exact pairs ever stay in a head's cache
        for layer_cache in job.cache:
            layer_cache.trim(job.k - 1)
    qs = [mx.stack(p) if p else None for p in probs]
    mx.eval([a for _, ids, conf in depths for a in (ids, conf)] + [q for q in qs if q is not None])
    drafted, confidences = [[] for _ in jobs], [[] for _ in jobs]
    for rows, ids, conf in depths:
        for n, token, logprob in zip(rows, ids.tolist(), conf.tolist()):
            drafted[n].append(token)
            confidences[n].append(logprob)
    return [MTPDraft(i, c, q) for i, c, q in zip(drafted, confidences, qs)]


def _forward(head: MTPHead, hidden: list[mx.array], tokens: list[mx.array], caches: list, embed, final_norm,
             exact: bool, one_row_each: bool = False) -> mx.array:
    """The head over every sequence's rows (hidden [n_s, F], tokens [n_s]; one_row_each: one block of
    a row per sequence); each sequence's last row's normed output, [sequences, d]. Each sequence's
    cache takes its rows."""
    counts = [1] * len(caches) if one_row_each else [t.shape[0] for t in tokens]
    rows = sum(counts)
    padded = 1 << (rows - 1).bit_length()
    positions = [c[0].offset + i for c, n in zip(caches, counts) for i in range(n)]
    h, t = mx.concatenate(hidden), mx.concatenate(tokens)
    if padded > rows:  # padding rows: computed, never read
        h = mx.concatenate([h, mx.zeros((padded - rows, h.shape[-1]), h.dtype)])
        t = mx.concatenate([t, mx.zeros((padded - rows,), t.dtype)])
        positions += [0] * (padded - rows)
    x = head.fuse(h[:, None], t[:, None], embed, exact)  # [padded, 1, d]: one row per batch element
    block = head.layers[0]
    before, after = _graphs(block) if type(block) is CompiledMTPBlock else _parts(block)
    queries, keys, values = before(x, mx.array(positions))  # [padded, H, 1, D]
    merged, start = [], 0
    for cache, n in zip(caches, counts):
        q, k, v = (a[start:start + n].transpose(2, 1, 0, 3) for a in (queries, keys, values))  # [1, H, n, D]
        k, v = cache[0].update_and_fetch(k, v)
        merged.append(_attention(block, q, k, v, cache[0], "causal" if n > 1 else None)[0])  # [n, H * D]
        start += n
    if padded > rows:
        merged.append(mx.zeros((padded - rows, merged[0].shape[-1]), merged[0].dtype))
    out = after(x, mx.concatenate(merged)[:, None])  # [padded, 1, d]
    out = out[:len(counts), 0] if one_row_each else out[mx.array(list(accumulate(counts))) - 1, 0]
    return head.norm(out) if "norm" in head else final_norm(out)
