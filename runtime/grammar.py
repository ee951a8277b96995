"""Structured output: response_format compiled to an llguidance grammar at the edge, and the
per-sequence matcher the scheduler keeps to cut drafts the grammar forbids before verification.

llguidance (README "Structured output" says why): a token mask costs ~0.01-0.05 ms per token on this
CPU, it rolls back (a verify walks the drafts and returns), and it reports the tokens the grammar
forces. The owner masks the target's logits with a matcher of its own (kernels/processing.py); both
consume the same emitted tokens, so they agree on every position.
"""

from __future__ import annotations

from functools import lru_cache

from runtime.unsupported import ProtocolError

# One line of JSON, spaced as models usually write it: no free whitespace for a small model to loop on.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_for(response_format: dict | None) -> str | None:
    """The llguidance grammar a response_format asks for; None for text. A 400 names what is wrong."""
    import llguidance

    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema, where = {"type": "object"}, "response_format"
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ProtocolError("response_format.json_schema must be an object with a schema object",
                                "response_format.json_schema")
        schema, where = spec.get("schema", {}), "response_format.json_schema.schema"
    else:
        raise ProtocolError(f"response_format.type must be text, json_object or json_schema, not {kind!r}",
                            "response_format.type")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except ValueError as e:
        raise ProtocolError(f"{where}: {e}", where) from None
    if error := llguidance.LLMatcher.validate_grammar(grammar):
        raise ProtocolError(f"{where} cannot be compiled to a grammar: {error}", where)
    return grammar


@lru_cache(maxsize=4)
def grammar_tokenizer(tok, eos_ids: tuple[int, ...]):
    """llguidance's view of the model's tokenizer (built once per tokenizer: ~0.5 s)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tok, eos_token=list(eos_ids))


@lru_cache(maxsize=4)
def tokenizer_of_dir(model_dir: str):
    """The owner's grammar tokenizer: from the model directory, as the codec reads it."""
    from runtime.text import TextCodec

    codec = TextCodec(model_dir)
    return grammar_tokenizer(codec.tok, tuple(sorted(codec.eos_ids)))


def new_matcher(grammar: str, tokenizer):
    import llguidance

    matcher = llguidance.LLMatcher(tokenizer, grammar)
    if matcher.is_error():
        raise ValueError(f"grammar rejected: {matcher.get_error()}")
    return matcher


class Constraint:
    """The scheduler's matcher of one sequence: what the grammar allows next, as tokens go out."""

    def __init__(self, grammar: str, tokenizer):
        self.matcher = new_matcher(grammar, tokenizer)

    def allowed_prefix(self, drafts) -> int:
        """How many leading drafts the grammar allows from here (the rest are cut unverified)."""
        return self.matcher.validate_tokens(list(drafts)) if drafts else 0

    def advance(self, tokens) -> None:
        for token in tokens:
            if not self.matcher.consume_token(token):
                return  # the owner masked every draw: only an ending token can land here

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (one allowed continuation), possibly none."""
        return self.matcher.compute_ff_tokens()
