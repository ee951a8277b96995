"""Text side of the model: chat template, tokenization, and incremental detokenization with stops.

Uses the Hugging Face tokenizer of the model directory (no MLX), so admission and the scheduler can
encode and decode without a hop to the model owner.
"""

from __future__ import annotations

from pathlib import Path

from runtime.messages import ChatMessage


class TextCodec:
    def __init__(self, model_dir: Path | str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_ids = frozenset(self._eos_ids(Path(model_dir)))
        self.think_ids = self._marker_pair("<think>", "</think>")

    def _eos_ids(self, model_dir: Path) -> set[int]:
        import json

        ids = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        config = json.loads((model_dir / "config.json").read_text())
        eos = config.get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids

    def _marker_pair(self, start: str, end: str) -> tuple[int, int] | None:
        vocab = self.tok.get_vocab()
        return (vocab[start], vocab[end]) if start in vocab and end in vocab else None

    @property
    def has_chat_template(self) -> bool:
        return self.tok.chat_template is not None

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template takes a tools list (it names the variable)."""
        return "tools" in (self.tok.chat_template or "")

    def chat_text(self, messages: tuple[ChatMessage, ...], tools: tuple[dict, ...] = ()) -> str:
        rendered = [{"role": m.role, "content": m.content,
                     **({"tool_calls": list(m.tool_calls)} if m.tool_calls else {}),
                     **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})} for m in messages]
        extra = {"tools": list(tools)} if tools else {}
        return self.tok.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False, **extra)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    def encode(self, text: str) -> list[int]:
        # As mlx-lm does: no BOS added when the text already starts with it (a rendered template).
        bos = self.tok.bos_token
        return self.tok.encode(text, add_special_tokens=bos is None or not text.startswith(bos))

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))

    def start_ids(self) -> list[int]:
        """What a prompt that encodes to no tokens is conditioned on: BOS, else the end-of-text token."""
        for token in (self.tok.bos_token_id, self.tok.eos_token_id):
            if token is not None:
                return [int(token)]
        return [min(self.eos_ids)]


class IncrementalText:
    """Turns token ids into text deltas; holds back text that may be the start of a stop string."""

    def __init__(self, codec: TextCodec, stop: tuple[str, ...] = ()):
        self.codec, self.stop = codec, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # stable text decoded so far
        self.emitted = 0  # characters of self.text already handed out
        self._prefix = 0  # ids[_prefix:_read] decode to text already in self.text
        self._read = 0
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the text

    def add(self, ids) -> str:
        """Feed new ids; returns the text that may be shown now. Sets .stopped on a stop string."""
        self.ids.extend(ids)
        self._advance()
        return self._release()

    def flush(self) -> str:
        """At the end of the sequence: all remaining text (a stop string never reaches here)."""
        if self.stopped:
            return ""
        tail = self.codec.decode(self.ids[self._prefix:])
        self.text += tail[len(self.codec.decode(self.ids[self._prefix:self._read])):]
        self._prefix = self._read = len(self.ids)
        delta, self.emitted = self.text[self.emitted:], len(self.text)
        return delta

    def _advance(self) -> None:
        # Decode a short window: text before _read is known, bytes after may be an incomplete char.
        before = self.codec.decode(self.ids[self._prefix:self._read])
        after = self.codec.decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)

    def _release(self) -> str:
        if self.stopped:
            return ""
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
            self.stop_hit = next(s for s in self.stop if self.text.find(s, start) == end)
        else:
            end = len(self.text) - self._holdback()
        delta = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return delta

    def _holdback(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
