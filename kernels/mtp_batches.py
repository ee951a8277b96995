"""Training examples for an MTP head from self-distillation shards: windows, batches, draft vocabulary.

A window of a sequence covers positions j in [start, start + width): inputs h_j (a fused head: its
layers' outputs, then h_j) and tokens[j+1],
target g_{j+1} (the base's greedy token after tokens[j+1]) mapped into the draft vocabulary, and
h_{j+1}, the base's own hidden state there, which the head's output should resemble.
Batches are bucketed by window length (little padding) and drawn in an order fixed by
(seed, epoch), so batch n is the same batch in a resumed run. Pure numpy until `as_arrays`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kernels.features import select

BUCKET = 64  # batches are formed within groups of BUCKET * batch windows sorted by length


@dataclass(frozen=True)
class Sequence:
    tokens: np.ndarray  # int32 [T]
    hidden: np.ndarray  # float16 [T, d]; row T-1 is empty
    argmax: np.ndarray  # int32 [T]; -1 where there is no h_t
    prompt_len: int
    features: np.ndarray | None = None  # float16 [T, n*d]: the outputs of a fused head's n layers


def sequences_from(shards: list[dict[str, np.ndarray]], stored: tuple[int, ...] = (),
                   wanted: tuple[int, ...] = ()) -> list[Sequence]:
    """The shards' sequences; with `wanted` layers (a fused head), their outputs picked from the
    layers the data `stored`."""
    seqs = []
    for shard in shards:
        starts = shard["starts"]
        kept = shard.get("features", shard["hidden"][:, :0])  # data made without layers keeps none
        extra = select(kept, stored, wanted, shard["hidden"].shape[1]) if wanted else None
        for n, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
            seqs.append(Sequence(shard["tokens"][a:b], shard["hidden"][a:b], shard["argmax"][a:b],
                                 int(shard["prompt_lens"][n]), None if extra is None else extra[a:b]))
    return seqs


def split_sequences(seqs: list[Sequence], every: int = 20) -> tuple[list[Sequence], list[Sequence]]:
    """(train, validation): every `every`-th sequence is held out for validation."""
    train = [s for i, s in enumerate(seqs) if i % every != every - 1]
    return train, [s for i, s in enumerate(seqs) if i % every == every - 1]


def answer_targets(seq: Sequence) -> np.ndarray:
    """The base's greedy tokens over its answer: what drafts must match when serving."""
    top = seq.argmax[seq.prompt_len - 1 :]
    return top[top >= 0]


def frequent_tokens(seqs: list[Sequence], count: int, vocab_size: int) -> list[int]:
    """The `count` tokens the base emits most often in its answers (ties by id), topped up with
    its most frequent predictions anywhere, then by id, so the list is always full."""
    answers = Counter(np.concatenate([answer_targets(s) for s in seqs]).tolist())
    anywhere = Counter(np.concatenate([s.argmax[s.argmax >= 0] for s in seqs]).tolist())
    chosen = [t for t, _ in sorted(answers.items(), key=lambda kv: (-kv[1], kv[0]))][:count]
    taken = set(chosen)
    for source in (sorted(anywhere.items(), key=lambda kv: (-kv[1], kv[0])), ((t, 0) for t in range(vocab_size))):
        for token, _ in source:
            if len(chosen) == count:
                return chosen
            if token not in taken:
                chosen.append(token)
                taken.add(token)
    return chosen


def coverage(seqs: list[Sequence], token_ids: list[int]) -> float:
    """Share of answer targets inside the draft vocabulary: an upper bound on acceptance."""
    targets = np.concatenate([answer_targets(s) for s in seqs])
    return float(np.isin(targets, np.array(token_ids)).mean())


def draft_index(token_ids: list[int], vocab_size: int) -> np.ndarray:
    """full id -> position in the draft vocabulary, -1 for ids it lacks."""
    index = np.full(vocab_size, -1, np.int32)
    index[np.array(token_ids)] = np.arange(len(token_ids), dtype=np.int32)
    return index


def windows(seqs: list[Sequence], width: int) -> list[tuple[int, int, int]]:
    """(sequence, start, length) for consecutive windows over positions 0..T-2 of each sequence."""
    out = []
    for n, seq in enumerate(seqs):
        usable = len(seq.tokens) - 1  # position j needs tokens[j+1]
        out += [(n, s, min(width, usable - s)) for s in range(0, usable, width) if usable - s >= 2]
    return out


class Batches:
    """answers_only: targets and feature regression only where tokens[j+1] is an answer token, the
    positions the head drafts from when serving (the prompt stays as attended context)."""

    def __init__(self, seqs: list[Sequence], index: np.ndarray, width: int, batch: int, seed: int,
                 answers_only: bool = False):
        self.seqs, self.index, self.batch, self.seed = seqs, index, batch, seed
        self.answers_only = answers_only
        self.windows = windows(seqs, width)
        self.steps_per_epoch = max(1, len(self.windows) // batch)
        self._epoch, self._order = -1, []

    def at(self, step: int) -> dict[str, mx.array]:
        epoch, offset = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self._plan(epoch)
        return self.as_arrays(self._order[offset])

    def all(self) -> list[dict[str, mx.array]]:
        """Every window once, in fixed length-sorted batches: for validation."""
        ranked = sorted(self.windows, key=lambda w: (w[2], w[0], w[1]))
        return [self.as_arrays(ranked[i : i + self.batch]) for i in range(0, len(ranked), self.batch)]

    def _plan(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        rng = np.random.default_rng([self.seed, epoch])
        shuffled = [self.windows[i] for i in rng.permutation(len(self.windows))]
        groups = []
        for g in range(0, len(shuffled), BUCKET * self.batch):
            ranked = sorted(shuffled[g : g + BUCKET * self.batch], key=lambda w: w[2])
            groups += [ranked[i : i + self.batch] for i in range(0, len(ranked), self.batch)]
        groups = [b for b in groups if len(b) == self.batch]
        return [groups[i] for i in rng.permutation(len(groups))]

    def as_arrays(self, chosen: list[tuple[int, int, int]]) -> dict[str, mx.array]:
        width = max(length for _, _, length in chosen)
        dim = self.seqs[0].hidden.shape[1]
        extra = 0 if self.seqs[0].features is None else self.seqs[0].features.shape[1]
        hidden = np.zeros((len(chosen), width, extra + dim), np.float32)  # the head's exact-pair input
        next_hidden = np.zeros((len(chosen), width, dim), np.float32)
        tokens = np.zeros((len(chosen), width), np.int32)
        targets = np.full((len(chosen), width), -1, np.int32)
        present = np.zeros((len(chosen), width), bool)
        for row, (n, start, length) in enumerate(chosen):
            seq, stop = self.seqs[n], start + length
            hidden[row, :length, extra:] = seq.hidden[start:stop]
            if extra:
                hidden[row, :length, :extra] = seq.features[start:stop]
            next_hidden[row, :length] = seq.hidden[start + 1 : stop + 1]
            tokens[row, :length] = seq.tokens[start + 1 : stop + 1]
            target = seq.argmax[start + 1 : stop + 1]
            if self.answers_only:  # tokens[j+1] still in the prompt: nothing the head will draft
                target = np.where(np.arange(start + 1, stop + 1) >= seq.prompt_len, target, -1)
            present[row, :length] = target >= 0
            targets[row, :length] = np.where(target >= 0, self.index[np.maximum(target, 0)], -1)
        return {
            "hidden": mx.array(hidden), "next_hidden": mx.array(next_hidden), "tokens": mx.array(tokens), "targets": mx.array(targets),
            "valid": mx.array(targets >= 0), "present": mx.array(present),
        }
