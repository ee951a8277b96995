"""Log-probabilities on the wire: the chat form (content: one entry per token, with its top
alternatives) and the legacy completions form (tokens, token_logprobs, top_logprobs, text_offset).

A token's text is what it decodes to alone (a partial UTF-8 character shows as U+FFFD, as OpenAI's
does); its bytes are the raw bytes it stands for, so a client can join them into exact text.
"""

from __future__ import annotations

import math
from functools import lru_cache

from runtime.messages import TokenLogprob
from runtime.responses import ChoiceLogprobs, CompletionLogprobs, LogprobEntry, TopLogprob


class TokenTexts:
    """Each token's text and bytes, cached (the same few thousand tokens recur)."""

    def __init__(self, codec):
        self.tok = codec.tok
        backend = getattr(self.tok, "backend_tokenizer", None)
        byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
        self.byte_of = _byte_level_alphabet() if byte_level else None
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token: int) -> str:
        return self.tok.decode([token])

    def _bytes(self, token: int) -> list[int]:
        piece = self.tok.convert_ids_to_tokens(token)
        if self.byte_of is not None and piece is not None and all(c in self.byte_of for c in piece):
            return [self.byte_of[c] for c in piece]
        return list(self.text(token).encode("utf-8"))

    def entry(self, lp: TokenLogprob) -> LogprobEntry:
        return LogprobEntry(token=self.text(lp.token), logprob=finite(lp.logprob), bytes=self.bytes(lp.token),
                            top_logprobs=[TopLogprob(token=self.text(t), logprob=finite(v), bytes=self.bytes(t))
                                          for t, v in lp.top if v > -math.inf])

    def chat(self, logprobs) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=[self.entry(lp) for lp in logprobs])

    def completion(self, logprobs, offset: int = 0) -> CompletionLogprobs:
        """The legacy form; text_offset counts characters from `offset` (the echoed prompt's length)."""
        tokens = [self.text(lp.token) for lp in logprobs]
        offsets, at = [], offset
        for text in tokens:
            offsets.append(at)
            at += len(text)
        return CompletionLogprobs(tokens=tokens, token_logprobs=[finite(lp.logprob) for lp in logprobs],
                                  top_logprobs=[{self.text(t): finite(v) for t, v in lp.top if v > -math.inf}
                                                for lp in logprobs],
                                  text_offset=offsets)


def finite(logprob: float) -> float:
    """JSON has no -inf or NaN (they would go out as null): a token the processed distribution gave
    no mass (a grammar's mask, an extreme penalty) reads -9999.0, as OpenAI writes it."""
    return logprob if math.isfinite(logprob) else -9999.0


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE writes each byte as one printable character: printable Latin-1 bytes as
    themselves, the other 68 bytes as U+0100 onwards in byte order. The inverse of that map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}
