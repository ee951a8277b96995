"""Online acceptance: P(draft t accepted | drafts 1..t-1 were), learned per request and per phase.

Each verify outcome is a run of Bernoulli trials: positions 1..accepted+1 were tried (capped at
the drafts verified) and 1..accepted succeeded. Counts decay, so old evidence fades:
- `PhasePriors` keep the server's counts per content phase (runtime/content_phase.py), starting
  from the calibration table's by_depth with PRIOR_TRIALS pseudo-trials and decaying slowly per
  vote, so a phase whose acceptance rises is seen to rise. They answer "what does a request with
  no evidence of its own accept here", so only outcomes whose coming about owes nothing to the
  request's own acceptance vote, each request alike: its first outcome in a phase, at once, and at
  its end its whole record there as one vote (its rate at each position). Every later draft ran
  because of what the request had shown: a chosen one because its drafts were accepted (counted,
  the prior leaned toward the requests that accept well: 0.4 for chat whose requests averaged 0.25
  on an earlier head), an exploring one because they were not, or, one deeper, because they were.
  When exploring outcomes voted, chat's prior read 0.26-0.29 in one bench run and 0.39-0.43 in
  another on a 2-core AMD EPYC, where every chat draft accepts 0.356 at position 1 (fixed depth 1):
  a draft after a rejection accepts 0.30, and 0.33 still 2-24 steps later, since a rejection marks a
  request that accepts less.
- `RequestAcceptance` keeps one request's counts per phase, decaying per step (drafted or not), so
  a request that stopped drafting drifts back to its phase prior and gets tried again.
The posterior mean at position t is (hits + m prior) / (trials + m); its upper bound adds
Z standard errors. The bound is what exploration asks: could drafting still pay here?

A request's m is its phase's, learned from how far apart finished requests' first-draft rates
fall (`request_strength`, a method-of-moments beta-binomial fit): where requests of a phase accept
alike, a new one is expected to accept as they did, its bound is tight, and a phase measured as
losing is not explored again for each request; where they differ, m stays low and each request's
own drafts decide. A phase's fit ages: each request that ends there without drafting weakens it,
so evidence that stopped coming in reopens exploration (nothing is locked off for good).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from runtime.content_phase import Phase

# Strength of the table's prior in a phase never served: as much as six requests' two votes, so a
# table from another machine or head gives way within ~15 requests (test_request_spread.py).
PRIOR_TRIALS = 12.0
# Strength of the phase prior in a request's own posterior. A request's decayed evidence holds
# ~20 trials at most: at 3 a run of three rejections (0.4 likely at chat's 0.27) turned a request
# plain though drafting every step paid 1.14x; at 5 it takes about six, and a request that accepts
# nothing still stops within ~10 drafted steps (test_online_estimators).
REQUEST_TRIALS = 5.0
PHASE_DECAY = 0.99  # per vote: a phase remembers its last ~50 requests (two votes each)
REQUEST_DECAY = 0.95  # per step: a request remembers its last ~20 steps
Z = 1.64  # one-sided 95%: the upper bound exploration tests
# The fit of a phase's between-request spread: from this many finished requests that drafted there,
# over the last SPREAD_REQUESTS; m at most MAX_STRENGTH, so a request's own ~20 decayed trials still
# move its mean. Each request ending in the phase without a draft multiplies m's excess by AGING.
MIN_SPREAD_REQUESTS = 8
SPREAD_REQUESTS = 64
MAX_STRENGTH = 30.0
AGING = 0.9
DEFAULT_PRIOR = (0.3, 0.2, 0.15, 0.1)  # where no table has one: a weak drafter's shape


class Counts:
    """Decayed trials and hits by draft position (0-based lists, grown on demand)."""

    def __init__(self, trials: Sequence[float] = (), hits: Sequence[float] = ()):
        self.trials, self.hits = list(trials), list(hits)

    def add(self, drafted: int, accepted: int) -> None:
        tried = min(drafted, accepted + 1)  # a draft after a rejection was never judged
        self.grow(tried)
        for t in range(tried):
            self.trials[t] += 1.0
            self.hits[t] += t < accepted

    def grow(self, positions: int) -> None:
        while len(self.trials) < positions:
            self.trials.append(0.0)
            self.hits.append(0.0)

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


def request_strength(samples: Sequence[tuple[float, float]]) -> float:
    """A request's prior strength m from finished requests' (first-draft trials, hits): the
    binomial-corrected spread of their rates tau^2, and m = p(1-p)/tau^2 - 1 (the beta-binomial's
    moments), within [REQUEST_TRIALS, MAX_STRENGTH]; REQUEST_TRIALS under MIN_SPREAD_REQUESTS."""

    samples = [(n, h) for n, h in samples if n > 0]
    if len(samples) < MIN_SPREAD_REQUESTS:
        return REQUEST_TRIALS
    total = sum(n for n, _ in samples)
    p = sum(h for _, h in samples) / total
    noise = p * (1 - p)
    if noise <= 0:  # every request accepted all or nothing: as alike as requests get
        return MAX_STRENGTH
    # The weighted squared deviations less what binomial noise alone gives (k-1 times p(1-p)) and one
    # standard deviation of that noise (chi-square), so a few draws per request read as alike unless
    # they clearly are not: at 6 draws a request, chance alone gave m ~10 for identical requests.
    k = len(samples)
    spread = sum(n * (h / n - p) ** 2 for n, h in samples) - (k - 1 + math.sqrt(2 * (k - 1))) * noise
    scale = total - sum(n * n for n, _ in samples) / total
    tau2 = spread / scale if scale > 0 else 0.0
    if tau2 <= 0:
        return MAX_STRENGTH
    return min(MAX_STRENGTH, max(REQUEST_TRIALS, noise / tau2 - 1.0))


class PhasePriors:
    """The server's acceptance per content phase, from every request's outcomes."""

    def __init__(self, base: Sequence[float] = DEFAULT_PRIOR, depth: int = 8):
        self.base, self.depth = tuple(base) or DEFAULT_PRIOR, depth
        self.counts: dict[Phase, Counts] = {}
        self._means: dict[Phase, tuple[float, ...]] = {}  # every request reads them every step: kept till a vote
        self.samples: dict[Phase, deque[tuple[float, float]]] = {}  # finished requests' first-draft (trials, hits)
        self.unsampled: dict[Phase, int] = {}  # requests ended there without drafting since the last sample
        self._strengths: dict[Phase, float] = {}

    def note(self, phase: Phase, drafted: int, accepted: int) -> None:
        """One outcome as a vote: a request's first in the phase."""
        counts = self._decayed(phase)
        counts.add(drafted, accepted)

    def note_record(self, phase: Phase, record: Counts) -> None:
        """A finished request's whole record in the phase as one vote: its rate at each position tried."""
        counts = self._decayed(phase)
        for t in range(len(record.trials)):
            if record.trials[t] > 0:
                counts.grow(t + 1)
                counts.trials[t] += 1.0
                counts.hits[t] += record.hits[t] / record.trials[t]

    def _decayed(self, phase: Phase) -> Counts:
        counts = self.counts.setdefault(phase, Counts())
        counts.decay(PHASE_DECAY)
        self._means.pop(phase, None)
        return counts

    def mean(self, phase: Phase) -> tuple[float, ...]:
        if phase not in self._means:
            self._means[phase] = posterior(self.counts.get(phase, Counts()), self.base, PRIOR_TRIALS, self.depth)
        return self._means[phase]

    def note_request(self, phase: Phase, trials: float, hits: float) -> None:
        """A request ended: its first-draft totals in a phase where it ran (trials 0: it never drafted)."""
        if trials > 0:
            self.samples.setdefault(phase, deque(maxlen=SPREAD_REQUESTS)).append((trials, hits))
            self.unsampled[phase] = 0
        else:
            self.unsampled[phase] = self.unsampled.get(phase, 0) + 1
        self._strengths.pop(phase, None)

    def strength(self, phase: Phase) -> float:
        """m for a request's posterior here: the fitted spread's, aged by requests that did not draft."""
        if phase not in self._strengths:
            fitted = request_strength(self.samples.get(phase, ()))
            aged = AGING ** self.unsampled.get(phase, 0)
            self._strengths[phase] = REQUEST_TRIALS + (fitted - REQUEST_TRIALS) * aged
        return self._strengths[phase]

    def snapshot(self) -> dict:
        return {phase.value: [round(p, 3) for p in self.mean(phase)[:4]] for phase in self.counts}

    def strengths(self) -> dict:
        return {phase.value: round(self.strength(phase), 1) for phase in set(self.samples) | set(self.unsampled)}


class RequestAcceptance:
    """One request's own evidence per phase, shrunk toward the phase priors."""

    def __init__(self, priors: PhasePriors, start: dict[Phase, Counts] | None = None):
        self.priors = priors
        self.counts: dict[Phase, Counts] = {p: c.copy() for p, c in (start or {}).items()}
        self.voted: set[Phase] = set()  # phases whose prior has this request's first outcome
        self.records: dict[Phase, Counts] = {}  # undecayed, per phase drafted in: its vote at its end
        self.ran: set[Phase] = set()  # phases it ran in, drafted or not

    def note(self, phase: Phase, drafted: int, accepted: int) -> None:
        """One verify outcome, whatever ran it (a choice or exploration); the first in a phase votes at once."""
        self.counts.setdefault(phase, Counts()).add(drafted, accepted)
        self.records.setdefault(phase, Counts()).add(drafted, accepted)
        self.ran.add(phase)
        if phase not in self.voted:
            self.voted.add(phase)
            self.priors.note(phase, drafted, accepted)

    def step(self, phase: Phase | None = None) -> None:
        """One step passed (drafted or not) in `phase`: the request's own evidence fades a little."""
        if phase is not None:
            self.ran.add(phase)
        for counts in self.counts.values():
            counts.decay(REQUEST_DECAY)

    def finish(self) -> None:
        """The request ended: its record in each phase it drafted in votes there, and how it accepted
        in each phase it ran in feeds that phase's spread fit."""
        for phase, record in self.records.items():
            self.priors.note_record(phase, record)
        for phase in self.ran:  # its first-draft totals (position 1 of its record; none: it never drafted)
            self.priors.note_request(phase, *self.records.get(phase, Counts()).at(0))
        self.records, self.ran = {}, set()

    def mean(self, phase: Phase, depth: int) -> tuple[float, ...]:
        return posterior(self.counts.get(phase, Counts()), self.priors.mean(phase), self.priors.strength(phase),
                         depth)

    def upper(self, phase: Phase, depth: int) -> tuple[float, ...]:
        return posterior(self.counts.get(phase, Counts()), self.priors.mean(phase), self.priors.strength(phase),
                         depth, upper=True)
