"""Log-probabilities go out as JSON numbers: never null for -inf or NaN."""

import math

import msgspec

from runtime.logprobs import TokenTexts, finite
from runtime.messages import TokenLogprob


class Tok:
    def decode(self, ids):
        return "".join(f"t{i}" for i in ids)

    def convert_ids_to_tokens(self, i):
        return f"t{i}"


class Codec:
    tok = Tok()


def test_non_finite_logprobs_read_minus_9999_and_massless_alternatives_are_left_out():
    assert finite(-1.5) == -1.5 and finite(-math.inf) == -9999.0 and finite(math.nan) == -9999.0
    texts = TokenTexts(Codec())
    lp = TokenLogprob(token=3, logprob=-math.inf, top=((3, 0.0), (4, -math.inf), (5, -2.0)))
    for body in (texts.completion([lp]), texts.chat([lp])):
        wire = msgspec.json.encode(body)
        assert b'"logprob":null' not in wire and b":null," not in wire.replace(b'"refusal":null', b"")
        assert b"-9999.0" in wire
    legacy = texts.completion([lp])
    assert legacy.token_logprobs == [-9999.0] and legacy.top_logprobs == [{"t3": 0.0, "t5": -2.0}]
