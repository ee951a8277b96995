"""Fake peers for actor tests: a scripted model owner, a character codec, an event collector."""

from __future__ import annotations

import asyncio

from runtime.actor import Actor
from runtime.owner_messages import Decode, Decoded, Prefill, PrefillChunk, Prefilled, PrefillProgress, Release

EOS = 0


class CharCodec:
    """Token i decodes to one letter; token 0 is EOS."""

    eos_ids = frozenset({EOS})
    think_ids = None
    has_chat_template = True
    renders_tools = False

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + (i - 1) % 26) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") + 1 for c in text if c.isalpha()]

    def start_ids(self) -> list[int]:
        return [EOS]

    def chat_text(self, messages, tools=()) -> str:
        return "".join(m.content for m in messages)


class ScriptedOwner(Actor):
    """Emits script[seq_id] one token per step (default 1, 2, 3, ...); can be told to fail."""

    name = "model_owner"

    def __init__(self, scripts: dict[str, list[int]] | None = None, fail_on: set[str] = frozenset(),
                 step_delay: float = 0.0):
        super().__init__()
        self.scripts, self.fail_on, self.step_delay = scripts or {}, set(fail_on), step_delay
        self.positions: dict[str, int] = {}
        self.released: list[str] = []
        self.prefill_groups: list[int] = []
        self.group: list[str] = []  # the chunked prefill in flight
        self.group_left = 0  # its padded positions still to run
        self.budgets: list[int] = []  # each PrefillChunk's budget
        self.commands: list[str] = []  # message kinds in arrival order
        self.info = None

    def _next(self, seq_id: str) -> int:
        if seq_id in self.fail_on:
            raise RuntimeError(f"scripted failure for {seq_id}")
        i = self.positions.get(seq_id, 0)
        self.positions[seq_id] = i + 1
        script = self.scripts.get(seq_id)
        return script[i] if script is not None and i < len(script) else 1 + i % 20

    async def handle(self, msg):
        self.commands.append(type(msg).__name__)
        if self.step_delay:
            await asyncio.sleep(self.step_delay)
        match msg:
            case Prefill():
                return Prefilled(seq_id=msg.seq_id, token=self._next(msg.seq_id), seconds=0.0)
            case PrefillChunk():
                return self._chunk(msg)
            case Decode():
                return Decoded(tokens=tuple(self._next(s) for s in msg.seq_ids), seconds=0.001)
            case Release():
                self.released.append(msg.seq_id)


    def _chunk(self, msg: PrefillChunk) -> PrefillProgress:
        """Runs budget // rows positions of the group's longest prompt per chunk (0: all of it)."""
        if msg.items:
            self.prefill_groups.append(len(msg.items))
            self.group = [m.seq_id for m in msg.items]
            self.group_left = max(len(m.prompt_ids) for m in msg.items)
        self.budgets.append(msg.budget)
        rows = len(self.group)
        run = self.group_left if not msg.budget else min(self.group_left, max(1, msg.budget // rows))
        self.group_left -= run
        if self.group_left:
            return PrefillProgress(prefilled=(), tokens=run * rows, seconds=0.001)
        prefilled = tuple(Prefilled(seq_id=s, token=self._next(s), seconds=0.001) for s in self.group)
        return PrefillProgress(prefilled=prefilled, tokens=run * rows, seconds=0.001)


class Collector(Actor):
    """Stands in for the streamer: records every event it is told."""

    name = "streamer"

    def __init__(self):
        super().__init__()
        self.events: list = []
        self.terminal = asyncio.Event()

    async def handle(self, msg):
        self.events.append(msg)
        if type(msg).__name__ in ("Finished", "Cancelled", "Failed"):
            self.terminal.set()

    def of(self, request_id: str) -> list:
        return [e for e in self.events if getattr(e, "request_id", None) == request_id]

    def terminals(self) -> list:
        return [e for e in self.events if type(e).__name__ in ("Finished", "Cancelled", "Failed")]


class Sink(Actor):
    """Accepts anything (telemetry stand-in)."""

    name = "telemetry"

    async def handle(self, msg):
        return None


class ScriptedSpecOwner(ScriptedOwner):
    """Also verifies drafts greedily against the script and records rollbacks."""

    def __init__(self, scripts):
        super().__init__(scripts)
        self.rollbacks: list = []
        self.batches: list[int] = []
        self.started_ahead: list[tuple[str, ...]] = []

    def _verify(self, msg):
        from runtime.owner_messages import Verified

        i = self.positions[msg.seq_id]
        truth = self.scripts[msg.seq_id][i:i + len(msg.drafts) + 1]
        n = 0
        while n < len(msg.drafts) and msg.drafts[n] == truth[n]:
            n += 1
        if not msg.drafts:  # a plain row advances at once; draft rows advance at their rollback
            self.positions[msg.seq_id] += 1
        return Verified(accepted=n, emitted=tuple(truth[:n + 1]), seconds=0.001)

    async def handle(self, msg):
        from runtime.owner_messages import Rollback, StartAhead, VerifiedBatch, VerifyBatch, VerifyDrafts

        match msg:
            case VerifyDrafts():
                return self._verify(msg)
            case VerifyBatch():
                self.batches.append(len(msg.rows))
                return VerifiedBatch(results=tuple(self._verify(r) for r in msg.rows), seconds=0.001)
            case Rollback():
                self.rollbacks.append(msg)
                self.positions[msg.seq_id] += len(msg.emitted)
            case StartAhead():
                self.started_ahead.append(msg.seq_ids)  # a script has no compute to start early
            case _:
                return await super().handle(msg)
