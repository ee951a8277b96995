"""Model owner: the only actor that calls MLX, every call on one dedicated thread.

Receives Prefill, PrefillChunk, Decode, Propose, ProposeMany, VerifyDrafts, VerifyBatch, TimeCell (asks:
replies Prefilled, PrefillProgress, Decoded, Drafted, Verified, VerifiedBatch, CellTimed), CanBranch,
ProposeTree, VerifyTree (hyper mode's draft trees: Branching, DraftedTree, TreeVerified), Describe (ask:
the prompt cache's account, for /health) and Release, Rollback, StartAhead (tells).
Sends the prompt cache's Samples to telemetry (once wired) after each prefill and release, and
FailInFlight(request_ids) to the scheduler (never waiting) when a Rollback or a lookahead start
fails: those sequences' state is unknown, so they fail rather than decode on.
Replies hold plain Python values, never an mx.array. A failed command fails only its asker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, assert_never

from runtime.actor import Actor
from runtime.config import SpecConfig
from runtime.prompt_cache import cache_scope
from runtime.messages import Describe, FailInFlight, Sample, TokenLogprob
from runtime.owner_messages import (
    Branching, CanBranch, Decode, Decoded, Drafted, DraftedTree, ModelInfo, Prefill, PrefillChunk, Prefilled,
    PrefillProgress, Propose, ProposeMany, ProposeTree, CellTimed, Quantization, Release, Rollback,
    StartAhead, TimeCell, OwnerCommand, TreeVerified, Verified, VerifiedBatch, VerifyBatch, VerifyDrafts,
    VerifyTree,
)


class ModelOwner(Actor):
    name = "model_owner"

    def __init__(self, model_path: Path, prefill_step: int = 2048, spec: SpecConfig = SpecConfig(),
                 batched: bool = False, rows_kernel: bool = True, prompt_cache: tuple[int, int] = (0, 0),
                 compiled_layers: bool = True, fused_kernels: bool = True):
        super().__init__()  # its inbox bound: Config.actors
        self.model_path = model_path
        self.prefill_step = prefill_step
        self.spec = spec
        self.batched = batched  # mtp_batch: decoding sequences share one batch cache
        self.rows_kernel = rows_kernel
        self.compiled_layers = compiled_layers
        self.fused_kernels = fused_kernels
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx-owner", initializer=self._started)
        self._native_id: int | None = None  # the owner thread's, once it runs (teardown waits for its end)
        self.engine = None
        self.info: ModelInfo | None = None
        self.timer = None  # the self-calibration's probes, built on its first TimeCell
        self.prompt_cache = prompt_cache  # (entries, bytes) at most; either 0: none
        self.telemetry: Actor | None = None  # where the prompt cache's samples go (System wires it)
        self.scheduler: Actor | None = None  # told to fail requests whose state a failed tell left unknown
        self.reported: dict = {}  # the prompt cache's counters as last sent
        # Distributed (actors/group_owner.py, actors/follower.py): the group's channel, set before loading
        self.channel, self.parallel = None, "auto"
        self.layout, self.pids, self.collectives_ms = None, [], {}
        self.timings: dict[str, tuple[int, float]] = {}  # per command kind: (count, seconds) on the thread

    async def on_thread(self, fn, *args) -> Any:
        """Run fn on the owner thread (MLX evaluates only on the thread that built the graph)."""
        return await self.submit(fn, *args)

    def follow_up(self, msg: StartAhead) -> None:
        """Queue a command on the owner thread without waiting: the next step's start, which must not
        delay this step's reply (MLX's CPU async_eval computes most of a forward before it returns).
        Later commands queue behind it; a failure fails its sequences (their state is unknown)."""
        self.submit(self.execute, msg).add_done_callback(lambda f: self._follow_up_done(f, msg.seq_ids))

    def submit(self, fn, *args) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _follow_up_done(self, future, lost: tuple[str, ...]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.log.error("follow_up_failed", error=repr(future.exception()))
            self.lose(lost, future.exception())

    def lose(self, seq_ids: tuple[str, ...], error: BaseException) -> None:
        """Tell the scheduler to fail these requests: a command that changes a sequence's state (no
        asker to fail) left it unknown, and decoding on would emit garbage. Never waits (the
        scheduler asks this actor: a waiting send back could deadlock)."""
        if seq_ids and self.scheduler is not None:
            self.scheduler.tell_nowait(FailInFlight(error=f"the model owner lost this request's state: {error!r}",
                                                    status=500, request_ids=tuple(seq_ids)))

    async def setup(self) -> None:
        started = time.perf_counter()
        self.info = await self.on_thread(self._load)
        self.log.info("model_loaded", model=self.info.model_id, blas=self.info.blas,
                      seconds=round(time.perf_counter() - started, 3))

    def _load(self) -> ModelInfo:
        from kernels import BLAS
        from kernels.engine import Engine
        from kernels.heads import build_drafter
        from kernels.loader import load

        if self.channel is not None:  # distributed: the ranks must load alike, checked before loading
            from kernels.group import join

            self.pids = join(self.channel, self.model_path, [self.prefill_step, self.spec, self.batched,
                                                             self.rows_kernel, self.prompt_cache, self.parallel])
        loaded = load(self.model_path, self.rows_kernel, self.channel, self.parallel,
                      compiled=self.compiled_layers, fused_kernels=self.fused_kernels)
        spec = self.spec
        drafter_kind, drafter = build_drafter(spec.drafter, loaded.model, self.model_path, spec.draft_model,
                                              spec.mtp_head, self.rows_kernel, self.compiled_layers,
                                              self.fused_kernels)
        from kernels.prompt_store import PromptStore

        share = loaded.layout[1] if loaded.layout else 1
        store = PromptStore(*self.prompt_cache, kv_share=share) if min(self.prompt_cache) > 0 else None
        self.engine = Engine(loaded.model, self.prefill_step, drafter, batched=self.batched, prompt_cache=store)
        if self.channel is not None:
            from kernels.sharding import started

            self.layout, self.collectives_ms = started(loaded, drafter, self.channel)
        else:  # a group's ranks run only the steps its leader sends
            from kernels.warm_up import warm_up

            warm_up(self.engine, spec.num_draft_tokens if drafter_kind != "none" else 0, loaded.vocab_size)
        return ModelInfo(model_id=self.model_path.name, path=str(self.model_path),
                         context_length=loaded.context_length, vocab_size=loaded.vocab_size,
                         blas=BLAS, matmul=loaded.matmul, dtype=loaded.dtype, drafter=drafter_kind,
                         quantization=Quantization(**loaded.quantization) if loaded.quantization else None)

    async def teardown(self) -> None:
        if self.engine is not None:
            await self.on_thread(self.engine.close)
        self._thread.shutdown(wait=True, cancel_futures=True)
        if self._native_id is not None:
            await thread_gone(self._native_id)

    def _started(self) -> None:
        self._native_id = threading.get_native_id()

    async def handle(self, msg: OwnerCommand | Describe) -> Any:
        match msg:
            case Describe():
                return self.describe_cache()
            case StartAhead():
                return self.follow_up(msg)
            case _:
                try:
                    reply = await self.on_thread(self.execute, msg)
                except Exception as e:
                    if isinstance(msg, Rollback):  # a tell: no asker learns of it
                        self.lose((msg.seq_id,), e)
                    raise
        match msg:
            case Prefill() if msg.lookahead and not self.batched:
                self.follow_up(StartAhead(seq_ids=(msg.seq_id,)))
            case Decode() if (ahead := tuple(s for s, a in zip(msg.seq_ids, msg.lookahead) if a)):
                self.follow_up(StartAhead(seq_ids=ahead))
        if isinstance(msg, (Prefill, PrefillChunk, Release)):
            await self.report_cache()
        return reply

    def execute(self, msg: OwnerCommand) -> Any:
        """Run one command on the owner thread (the other ranks of a distributed group run each
        command rank 0 runs, in the same order: actors/group_owner.py); its time goes to `timings`."""
        started = time.perf_counter()
        try:
            return self._run(msg)
        finally:
            kind = type(msg).__name__
            count, seconds = self.timings.get(kind, (0, 0.0))
            self.timings[kind] = (count + 1, seconds + time.perf_counter() - started)

    def describe_timings(self) -> dict:
        """What each kind of command has cost on the owner thread (for /health; plain numbers)."""
        return {kind: {"count": n, "mean_ms": round(1e3 * s / n, 3)} for kind, (n, s) in list(self.timings.items())}

    def _run(self, msg: OwnerCommand) -> Any:
        match msg:
            case Prefill():
                return self._prefill(msg)
            case PrefillChunk():
                return self._prefill_chunk(msg)
            case Decode():
                return self._decode(msg)
            case StartAhead():
                return self.engine.start_ahead(msg.seq_ids)
            case Propose():
                return self._propose(msg)
            case ProposeMany():
                return self._propose_many(msg)
            case VerifyDrafts():
                return self._verify(msg)
            case VerifyBatch():
                return self._verify_batch(msg)
            case Rollback():
                return self.engine.rollback(msg.seq_id, msg.drafted, msg.accepted, list(msg.emitted))
            case Release():
                return self.engine.release(msg.seq_id, msg.tokens)
            case TimeCell():
                return self._time_cell(msg)
            case CanBranch():
                return self._can_branch()
            case ProposeTree():
                return self._propose_tree(msg)
            case VerifyTree():
                return self._verify_tree(msg)
            case _:
                assert_never(msg)

    def _expect(self, msg: Prefill) -> None:
        """What the sequence's logits get before each draw: its penalties, its log-probabilities."""
        from kernels.processing import ProcessSpec

        p = msg.params
        if p.processed:
            self.engine.specs[msg.seq_id] = ProcessSpec(p.presence_penalty, p.frequency_penalty,
                                                        p.repetition_penalty, p.logprobs, self._matcher(p.grammar),
                                                        p.logit_bias)

    def _matcher(self, grammar: str | None):
        from runtime.grammar import new_matcher, tokenizer_of_dir

        return None if grammar is None else new_matcher(grammar, tokenizer_of_dir(str(self.model_path)))

    def _logprobs(self, seq_id: str) -> tuple[TokenLogprob, ...]:
        return tuple(TokenLogprob(token=t, logprob=lp, top=tuple((i, v) for i, v in alts))
                     for t, lp, alts in self.engine.take_logprobs(seq_id))

    def _prefill(self, msg: Prefill) -> Prefilled:
        started = time.perf_counter()
        p = msg.params
        self._expect(msg)
        token = self.engine.prefill(msg.seq_id, msg.prompt_ids, p.temperature, p.top_p, p.seed, False,
                                    drafts=not p.disable_mtp, scope=_scope(p))  # its lookahead follows the reply
        return Prefilled(seq_id=msg.seq_id, token=token, seconds=time.perf_counter() - started,
                         cached_tokens=self.engine.seqs[msg.seq_id].cached, logprobs=self._logprobs(msg.seq_id))

    def _prefill_chunk(self, msg: PrefillChunk) -> PrefillProgress:
        started = time.perf_counter()
        items = [(m.seq_id, list(m.prompt_ids), m.params.temperature, m.params.top_p, m.params.seed,
                  not m.params.disable_mtp, _scope(m.params)) for m in msg.items]
        for m in msg.items:
            self._expect(m)
        firsts, spent = self.engine.prefill_chunk(items, msg.budget or None)
        seconds = time.perf_counter() - started
        prefilled = tuple(Prefilled(seq_id=s, token=t, seconds=seconds, cached_tokens=self.engine.seqs[s].cached,
                                    logprobs=self._logprobs(s))
                          for s, t in (firsts or {}).items())
        return PrefillProgress(prefilled=prefilled, tokens=spent, seconds=seconds)

    def describe_cache(self) -> dict:
        """The prompt cache's account (its counters are plain ints: read off the owner thread)."""
        store = self.engine.prompt_cache if self.engine is not None else None
        return store.snapshot() if store is not None else {"enabled": False}

    async def report_cache(self) -> None:
        """Send telemetry what changed in the prompt cache since the last report."""
        account = self.describe_cache()
        if self.telemetry is None or not account["enabled"]:
            return
        for name in ("queries", "hits", "hit_tokens", "query_tokens", "evictions"):
            delta = account[name] - self.reported.get(name, 0)
            if delta or name not in self.reported:  # a first 0 shows the series from the start
                await self.telemetry.tell(Sample(name=f"prompt_cache_{name}", value=delta))
        for name in ("entries", "bytes"):
            if account[name] != self.reported.get(name):
                await self.telemetry.tell(Sample(name=f"prompt_cache_{name}", value=account[name], kind="gauge"))
        self.reported = account

    def _decode(self, msg: Decode) -> Decoded:
        started = time.perf_counter()
        # The lookahead is built now and started after the reply (engine.start_ahead says why)
        tokens = self.engine.decode(msg.seq_ids, msg.lookahead, launch=False)
        logprobs = tuple(self._logprobs(s) for s in msg.seq_ids)
        return Decoded(tokens=tuple(tokens), seconds=time.perf_counter() - started,
                       logprobs=logprobs if any(logprobs) else (), traces=_traces())

    def _propose(self, msg: Propose) -> Drafted:
        started = time.perf_counter()
        tokens, confidences = self.engine.propose(msg.seq_id, msg.k)
        state = self.engine.seqs[msg.seq_id]
        return Drafted(tokens=tuple(tokens), confidences=tuple(confidences), has_probs=state.draft_probs is not None,
                       seconds=time.perf_counter() - started, caught_up=state.caught_up)

    def _propose_many(self, msg: ProposeMany) -> tuple[Drafted, ...]:
        started = time.perf_counter()
        drafts = self.engine.propose_many([(item.seq_id, item.k) for item in msg.items])
        seconds = (time.perf_counter() - started) / len(msg.items)  # one forward for all: each its share
        states = [self.engine.seqs[item.seq_id] for item in msg.items]
        return tuple(Drafted(tokens=tuple(tokens), confidences=tuple(confidences), seconds=seconds,
                             has_probs=state.draft_probs is not None, caught_up=state.caught_up)
                     for (tokens, confidences), state in zip(drafts, states))

    def _verify(self, msg: VerifyDrafts) -> Verified:
        started = time.perf_counter()
        accepted, emitted = self.engine.verify(msg.seq_id, list(msg.drafts), msg.use_draft_probs)
        return Verified(accepted=accepted, emitted=tuple(emitted), seconds=time.perf_counter() - started,
                        logprobs=self._logprobs(msg.seq_id), traces=_traces())

    def _time_cell(self, msg: TimeCell) -> CellTimed:
        if self.timer is None:
            from kernels.cell_timer import CellTimer
            from runtime.energy import open_meter

            self.timer = CellTimer(self.engine, self.info.drafter, self.spec.num_draft_tokens,
                                   open_meter(self.spec.watts_per_core), self.info.vocab_size)
        ms, joules = self.timer.time(msg.kind, msg.width, msg.depth)
        return CellTimed(ms=ms, joules=joules)

    def _verify_batch(self, msg: VerifyBatch) -> VerifiedBatch:
        from kernels.batch_engine import step_rows

        started = time.perf_counter()
        rows = [(r.seq_id, list(r.drafts), r.use_draft_probs) for r in msg.rows]
        results = step_rows(self.engine, rows)
        seconds = time.perf_counter() - started
        return VerifiedBatch(results=tuple(Verified(accepted=a, emitted=tuple(e), seconds=seconds,
                                                    logprobs=self._logprobs(r.seq_id))
                                           for r, (a, e) in zip(msg.rows, results)), seconds=seconds,
                             traces=_traces())

    def _can_branch(self) -> Branching:
        from kernels.tree_verify import can_branch

        if self.batched:
            return Branching(ok=False, reason="mtp_batch keeps its sequences in one batch cache")
        if (why := can_branch(self.engine.model)) is not None:
            return Branching(ok=False, reason=why)
        if self.engine.drafter is not None and not hasattr(self.engine.drafter, "propose_tree"):
            return Branching(ok=False, reason=f"the {self.info.drafter} drafter drafts chains only")
        return Branching(ok=True)

    def _propose_tree(self, msg: ProposeTree) -> DraftedTree:
        started = time.perf_counter()
        spine, confidences, alternatives = self.engine.propose_tree(msg.seq_id, msg.k, msg.top)
        return DraftedTree(tokens=tuple(spine), confidences=tuple(confidences),
                           alternatives=tuple(tuple((t, p) for t, p in alts) for alts in alternatives),
                           seconds=time.perf_counter() - started, caught_up=self.engine.seqs[msg.seq_id].caught_up)

    def _verify_tree(self, msg: VerifyTree) -> TreeVerified:
        from kernels.tree import DraftTree

        started = time.perf_counter()
        result = self.engine.verify_tree(msg.seq_id, DraftTree(msg.tokens, msg.parents, msg.leaves), msg.layout)
        return TreeVerified(accepted=result.accepted, emitted=tuple(result.emitted), branch=result.branch,
                            branch_accepted=tuple(result.branch_accepted), seconds=time.perf_counter() - started)


def _traces() -> int:
    """The compiled graphs traced so far on this process (kernels/compiled_blocks.py)."""
    from kernels import compiled_blocks

    return compiled_blocks.traces


def _scope(params) -> str | None:
    return cache_scope(params.cache_prompt, params.cache_salt, not params.disable_mtp)


async def thread_gone(native_id: int, limit_s: float = 2.0) -> None:
    """Wait until the OS thread has ended, not only its Python part: its exit frees MLX's
    thread-local compile cache, which takes the GIL; were the interpreter finalizing by then (a
    command exiting right after its last system stopped), the process would abort. Linux only."""
    task = Path(f"/proc/self/task/{native_id}")
    deadline = time.monotonic() + limit_s
    while task.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
