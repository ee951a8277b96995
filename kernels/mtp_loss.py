"""The training objective of an MTP head: unrolled depths ("training-time test") and their weights.

Depths are unrolled as they run when drafting (EAGLE-3's training-time test): pass p >= 1 feeds the
previous pass's output at j-1 with tokens[j+1] (the token its draft must equal for the next one to
matter) and attends to exact pairs up to j-p plus its own chain, so deeper drafts learn from the
head's own states. Pass p at position j is thus depth p+1 of the chain whose first draft is at
j-p, and every pass has the same target at j: g_{j+1}, the base's greedy token after tokens[j+1].

Per depth: cross-entropy over the draft vocabulary (plus, with soft_weight, against the base's
whole next distribution there), and, as in EAGLE, the relative squared error of the head's output
against h_{j+1} (weighted 1/(p+1)), which keeps that output usable as the next depth's input.
Targets outside the draft vocabulary cannot be drafted: left out of the loss (but misses).

Depth weights (`weighting`):
- "harmonic": depth p's mean cross-entropy weighted 1/(p+1), as the shipped head was trained.
- "expected-length": what a verify step gains is the expected accepted length
  E = 1 + c_1 + c_1 c_2 + c_1 c_2 c_3 + ... (c_i: draft i right given drafts 1..i-1 right). Each
  chain's depth i is weighted by dE/dc_i = c_1..c_{i-1} (1 + c_{i+1} + c_{i+1} c_{i+2} + ...),
  with c the head's own probability of each target along that chain (no gradient through the
  weights): depth 2+ is trained where the chain before it holds, where it can still pay.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

WEIGHTINGS = ("harmonic", "expected-length")


class PassKeys:
    """Stands in for a KVCache while training: each pass's keys join those of the passes before."""

    offset = 0  # every pass runs over the same positions

    def __init__(self):
        self.keys, self.values = [], []

    def update_and_fetch(self, keys, values):
        self.keys.append(keys)
        self.values.append(values)
        return mx.concatenate(self.keys, axis=2), mx.concatenate(self.values, axis=2)


def unrolled_mask(width: int, depth: int) -> mx.array:
    """Keys pass `depth` sees at position j: exact pairs i <= j - depth, and the entry at
    j - depth + q of each pass q in 1..depth (its own drafting chain, as in the head's cache)."""
    j, i = mx.arange(width)[:, None], mx.arange(width)[None, :]
    blocks = [i <= j - depth] + [i == j - depth + q for q in range(1, depth + 1)]
    return mx.concatenate(blocks, axis=1)


def unrolled_outputs(head, base, hidden: mx.array, tokens: mx.array, depths: int):
    """The head's normed output at every position for each unrolled depth, [B, L, d] each.
    hidden: the exact pairs' target features (a fused head's layers and h_j)."""
    embed, final_norm = base.model.embed_tokens, base.model.norm
    keys, outputs = PassKeys(), []
    for depth in range(depths):
        x = head.fuse(hidden, tokens, embed, exact=depth == 0)
        outputs.append(final_norm(head.layers[0](x, unrolled_mask(hidden.shape[1], depth), keys)))
        # The next pass reads this pass's output one position back (a dummy at position 0).
        hidden = mx.concatenate([mx.zeros_like(outputs[-1][:, :1]), outputs[-1][:, :-1]], axis=1)
    return outputs


def depth_masks(batch: dict[str, mx.array], depth: int) -> tuple[mx.array, mx.array]:
    """(targets to score, positions with a next state) of pass `depth`; it starts at j = depth."""
    defined = mx.arange(batch["targets"].shape[1])[None, :] >= depth  # earlier: dummy inputs
    return batch["valid"] & defined, batch["present"] & defined


def unrolled_loss(head, base, batch: dict[str, mx.array], depths: int, feature_weight: float = 1.0,
                  soft_weight: float = 0.0, weighting: str = "harmonic"):
    """(weighted loss, per-depth correct counts, per-depth target counts)."""
    targets, next_hidden = batch["targets"], batch["next_hidden"]
    outputs = unrolled_outputs(head, base, batch["hidden"], batch["tokens"], depths)
    # The base's next distribution is the same target at every depth: computed once.
    teacher = mx.stop_gradient(mx.softmax(head.draft_lm_head(next_hidden), axis=-1)) if soft_weight else None
    losses, hards, masks, correct, counted, regression = [], [], [], [], [], mx.array(0.0)
    for depth, out in enumerate(outputs):
        logits = head.draft_lm_head(out)
        mask, present = depth_masks(batch, depth)
        hard = nn.losses.cross_entropy(logits, mx.maximum(targets, 0), reduction="none")
        soft = -(teacher * nn.log_softmax(logits, axis=-1)).sum(-1) if soft_weight else 0.0
        losses.append(hard + soft_weight * soft)
        hards.append(hard)
        masks.append(mask)
        error = (((out - next_hidden) ** 2).sum(-1) * present).sum()
        scale = ((next_hidden**2).sum(-1) * present).sum()
        regression = regression + feature_weight * error / mx.maximum(scale, 1e-6) / (depth + 1)
        correct.append(((mx.argmax(logits, axis=-1) == targets) & mask).sum())
        counted.append(present.sum())
    if weighting == "expected-length":
        # p(target) per position is exp(-hard cross-entropy); the weights carry no gradient.
        probs = [mx.stop_gradient(mx.exp(-hard)) * mask for hard, mask in zip(hards, masks)]
        weights = [w / mx.maximum(masks[0].sum(), 1) for w in expected_length_weights(probs)]
    else:
        weights = [1.0 / mx.maximum(m.sum(), 1) / (depth + 1) for depth, m in enumerate(masks)]
    cross_entropy = sum(((loss * mask) * weight).sum() for loss, mask, weight in zip(losses, masks, weights))
    return cross_entropy + regression, mx.stack(correct), mx.stack(counted)


def expected_length_weights(probs: list[mx.array]) -> list[mx.array]:
    """probs[p][b, j]: pass p's chance of its target at j (0 where it has none). Returns, per pass
    and position, dE/dc of the chain it belongs to (module docstring), at the pass's positions."""
    chains = [_shift(p, -d) for d, p in enumerate(probs)]  # chains[d][b, s]: depth d+1 of chain s
    weights = []
    for d in range(len(chains)):
        before = mx.ones_like(chains[0])
        for c in chains[:d]:
            before = before * c
        after, run = mx.ones_like(chains[0]), mx.ones_like(chains[0])
        for c in chains[d + 1:]:
            run = run * c
            after = after + run
        weights.append(_shift(before * after, d))
    return weights


def _shift(x: mx.array, n: int) -> mx.array:
    """x [B, W] moved n places along W (n > 0: right, n < 0: left), zeros coming in."""
    width = x.shape[1]
    if n == 0:
        return x
    if abs(n) >= width:
        return mx.zeros_like(x)
    pad = mx.zeros((x.shape[0], abs(n)), x.dtype)
    return mx.concatenate([pad, x[:, :-n]], axis=1) if n > 0 else mx.concatenate([x[:, -n:], pad], axis=1)


def validate(head, base, batches: list[dict], depths: int) -> dict:
    """On held-out windows: top-1 per depth given drafts 1..d-1 right (c_d), and the expected
    accepted length per verify, 1 + mean over chains of how many drafts in a row come out right."""
    correct, counted, run_total, chains = [0] * depths, [0] * depths, 0, 0
    for batch in batches:
        outputs = unrolled_outputs(head, base, batch["hidden"], batch["tokens"], depths)
        hits = []
        for depth, out in enumerate(outputs):
            mask, present = depth_masks(batch, depth)
            hit = (mx.argmax(head.draft_lm_head(out), axis=-1) == batch["targets"]) & mask
            correct[depth] += hit.sum().item()
            counted[depth] += present.sum().item()
            hits.append(_shift(hit.astype(mx.float32), -depth))  # chain view, as the weights
        run = mx.ones_like(hits[0])
        for hit in hits:
            run = run * hit
            run_total += run.sum().item()
        chains += depth_masks(batch, 0)[1].sum().item()
    return {"top1_by_depth": [round(c / max(n, 1), 4) for c, n in zip(correct, counted)],
            "expected_length": round(1 + run_total / max(chains, 1), 4)}
