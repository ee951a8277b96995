"""Online acceptance: P(draft t accepted | drafts 1..t-1 were), learned per request and per phase.

Each verify outcome is a run of Bernoulli trials: positions 1..accepted+1 were tried (capped at
the drafts verified) and 1..accepted succeeded. Counts decay, so old evidence fades:
- `PhasePriors` keep the server's counts per content phase (runtime/content_phase.py), starting
  from the calibration table's by_depth with PRIOR_TRIALS pseudo-trials and decaying slowly per
  outcome, so a phase whose acceptance rises is seen to rise. They answer "what does a request
  with no evidence of its own accept here", so each request votes once per phase, with its first
  outcome there: later drafts run because the request's own evidence was good, and counting them
  would lean the prior toward the requests that accept well (0.4 for chat whose requests average
  0.25 on this model), so every new request would draft a few losing steps.
- `RequestAcceptance` keeps one request's counts per phase, decaying per step (drafted or not), so
  a request that stopped drafting drifts back to its phase prior and gets tried again.
The posterior mean at position t is (hits + m prior) / (trials + m); its upper bound adds
Z standard errors. The bound is what exploration asks: could drafting still pay here?

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from typing import Sequence

from runtime.content_phase import Phase

PRIOR_TRIALS = 20.0  # strength of the table's prior in a phase never served
# Strength of the phase prior in a request's own posterior. A request's decayed evidence holds
# ~20 trials at most: at 3 a run of three rejections (0.4 likely at chat's 0.27) turned a request
# plain though drafting every step paid 1.14x; at 5 it takes about six, and a request that accepts
# nothing still stops within ~10 drafted steps (test_online_estimators).
REQUEST_TRIALS = 5.0
PHASE_DECAY = 0.99  # per vote: a phase remembers its last ~100 requests
REQUEST_DECAY = 0.95  # per step: a request remembers its last ~20 steps
Z = 1.64  # one-sided 95%: the upper bound exploration tests
DEFAULT_PRIOR = (0.3, 0.2, 0.15, 0.1)  # where no table has one: a weak drafter's shape


class Counts:
    """Decayed trials and hits by draft position (0-based lists, grown on demand)."""

    def __init__(self, trials: Sequence[float] = (), hits: Sequence[float] = ()):
        self.trials, self.hits = list(trials), list(hits)

    def add(self, drafted: int, accepted: int) -> None:
        tried = min(drafted, accepted + 1)  # a draft after a rejection was never judged
        while len(self.trials) < tried:
            self.trials.append(0.0)
            self.hits.append(0.0)
        for t in range(tried):
            self.trials[t] += 1.0
            self.hits[t] += t < accepted

    def decay(self, factor: float) -> None:
        self.trials = [x * factor for x in self.trials]
        self.hits = [x * factor for x in self.hits]

    def at(self, t: int) -> tuple[float, float]:
        return (self.trials[t], self.hits[t]) if t < len(self.trials) else (0.0, 0.0)

    def copy(self) -> Counts:
        return Counts(self.trials, self.hits)


def posterior(counts: Counts, prior: Sequence[float], strength: float, depth: int,
              upper: bool = False) -> tuple[float, ...]:
    """Posterior P(accept) at positions 1..depth (the upper bounds if upper)."""
    out = []
    for t in range(depth):
        p0 = prior[min(t, len(prior) - 1)] if prior else 0.0
        trials, hits = counts.at(t)
        n = trials + strength
        p = (hits + strength * p0) / n
        if upper:
            p = min(1.0, p + Z * math.sqrt(max(p * (1 - p), 0.01) / n))
        out.append(p)
    return tuple(out)


class PhasePriors:
    """The server's acceptance per content phase, from every request's outcomes."""

    def __init__(self, base: Sequence[float] = DEFAULT_PRIOR, depth: int = 8):
        self.base, self.depth = tuple(base) or DEFAULT_PRIOR, depth
        self.counts: dict[Phase, Counts] = {}
        self._means: dict[Phase, tuple[float, ...]] = {}  # every request reads them every step: kept till a vote

    def note(self, phase: Phase, drafted: int, accepted: int) -> None:
        counts = self.counts.setdefault(phase, Counts())
        counts.decay(PHASE_DECAY)
        counts.add(drafted, accepted)
        self._means.pop(phase, None)

    def mean(self, phase: Phase) -> tuple[float, ...]:
        if phase not in self._means:
            self._means[phase] = posterior(self.counts.get(phase, Counts()), self.base, PRIOR_TRIALS, self.depth)
        return self._means[phase]

    def snapshot(self) -> dict:
        return {phase.value: [round(p, 3) for p in self.mean(phase)[:4]] for phase in self.counts}


class RequestAcceptance:
    """One request's own evidence per phase, shrunk toward the phase priors."""

    def __init__(self, priors: PhasePriors, start: dict[Phase, Counts] | None = None):
        self.priors = priors
        self.counts: dict[Phase, Counts] = {p: c.copy() for p, c in (start or {}).items()}
        self.voted: set[Phase] = set()  # phases whose prior has this request's first outcome

    def note(self, phase: Phase, drafted: int, accepted: int) -> None:
        self.counts.setdefault(phase, Counts()).add(drafted, accepted)
        if phase not in self.voted:
            self.voted.add(phase)
            self.priors.note(phase, drafted, accepted)

    def step(self) -> None:
        """One step passed (drafted or not): the request's own evidence fades a little."""
        for counts in self.counts.values():
            counts.decay(REQUEST_DECAY)

    def mean(self, phase: Phase, depth: int) -> tuple[float, ...]:
        return posterior(self.counts.get(phase, Counts()), self.priors.mean(phase), REQUEST_TRIALS, depth)

    def upper(self, phase: Phase, depth: int) -> tuple[float, ...]:
        return posterior(self.counts.get(phase, Counts()), self.priors.mean(phase), REQUEST_TRIALS, depth,
                         upper=True)
