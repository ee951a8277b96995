"""Admission: tokenizes requests, enforces the pending limit and the context length, hands them on.

Wire checks (max_tokens range, empty prompt or messages) are made once, in runtime/protocol.py;
admission keeps the rules that need the tokenizer or the model's context length.

Receives Submit (ask: replies Admitted, or raises Rejected with a 4xx). A slot is released by
release() (the streamer calls it at each request's terminal event): admission's own code, run
synchronously, that awaits nothing. A release therefore never waits on admission's inbox, and the
old cycle of awaiting sends (scheduler -> streamer -> admission -> scheduler) cannot form: the send
graph is acyclic (tests/unit/test_send_graph.py). Sends Admitted to the scheduler, in arrival
order, in every mode. In hyper mode the HyperAdmissionGate of spec/hyper.md
(runtime/hyper.py) takes each request's ticket as the scheduler receives it and binds the request to
its run there, one at a time: the gate's tickets must live with the runs they settle, and only the
scheduler runs requests; admission's own rules (the pending limit, the context) stay the same.
"""

from __future__ import annotations

import time
from typing import assert_never

from runtime.actor import Actor, Rejected
from runtime.config import AdmissionConfig
from runtime.messages import Admitted, SamplingParams, Sample, Submit
from runtime.text import TextCodec


class Admission(Actor):
    name = "admission"

    def __init__(self, config: AdmissionConfig, codec: TextCodec, context_length: int,
                 scheduler: Actor, telemetry: Actor):
        super().__init__()  # its inbox bound: Config.actors
        self.config, self.codec, self.context_length = config, codec, context_length
        self.scheduler, self.telemetry = scheduler, telemetry
        self.pending: set[str] = set()

    def release(self, request_id: str) -> None:
        """A request ended: free its slot. Synchronous (atomic in the event loop, no await), so a
        peer's release can never be held up by admission waiting on the scheduler."""
        self.pending.discard(request_id)

    async def handle(self, msg: Submit) -> Admitted:
        match msg:
            case Submit():
                return await self.admit(msg)
            case _:
                assert_never(msg)

    async def admit(self, msg: Submit) -> Admitted:
        log = self.log.bind(request_id=msg.request_id)
        if len(self.pending) >= self.config.max_pending:
            await self.telemetry.tell(Sample(name="rejected_total", value=1, labels=(("reason", "queue_full"),)))
            raise Rejected(f"server is at its limit of {self.config.max_pending} pending requests; retry later", 429)
        prompt_ids = self.tokenize(msg)
        field = "messages" if msg.messages is not None else "prompt"
        params = self.fit_to_context(msg.params, len(prompt_ids), field)
        if params.logit_bias and params.logit_bias[-1][0] >= self.codec.vocab_size:
            raise Rejected(f"logit_bias names token {params.logit_bias[-1][0]}; this model's vocabulary has "
                           f"{self.codec.vocab_size} tokens", 400, "logit_bias")
        admitted = Admitted(request_id=msg.request_id, prompt_ids=tuple(prompt_ids), params=params,
                            submitted_at=msg.submitted_at or time.monotonic())
        self.pending.add(msg.request_id)
        await self.scheduler.tell(admitted)
        log.info("admitted", prompt_tokens=len(prompt_ids), max_tokens=params.max_tokens,
                 pending=len(self.pending))
        return admitted

    def tokenize(self, msg: Submit) -> list[int]:
        if msg.messages is not None:
            if not self.codec.has_chat_template:
                raise Rejected("this model has no chat template: use /v1/completions", 400, "messages")
            if msg.tools and not self.codec.renders_tools:
                raise Rejected("tools are not supported by this model's chat template (it does not render "
                               "them): omit tools, or serve a model whose template takes them", 400, "tools")
            text = self.codec.chat_text(msg.messages, msg.tools)
        else:
            text = msg.prompt or ""
        ids = self.codec.encode(text)
        # Text can encode to nothing (a lone control character): it is then a prompt with no text,
        # conditioned on the model's start token, as OpenAI's completions treat an empty prompt.
        return ids or self.codec.start_ids()

    def fit_to_context(self, params: SamplingParams, prompt_tokens: int, field: str) -> SamplingParams:
        room = self.context_length - prompt_tokens
        if room < 1:
            raise Rejected(f"the prompt has {prompt_tokens} tokens; this model's context is "
                           f"{self.context_length} tokens", 400, field)
        if params.max_tokens <= room:
            return params
        import msgspec

        return msgspec.structs.replace(params, max_tokens=room)  # ends with finish_reason "length"
