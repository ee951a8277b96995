"""Tool calls: the edge's checks, the call grammar, and the parser (however the text is cut)."""

import json

import llguidance
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.tools import ToolCallParser, call_grammar, check_tools
from runtime.unsupported import ProtocolError

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "g"}}]
TEXT = ('Let me check. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "g", "arguments": {}}</tool_call><tool_call>not json</tool_call> done <tool')


def parse_in(pieces):
    parser, content, calls = ToolCallParser(), "", []
    for piece in pieces:
        text, done = parser.feed(piece)
        content, calls = content + text, calls + done
    return content + parser.flush(), calls


@given(st.lists(st.integers(0, len(TEXT)), max_size=12))
def test_the_parse_does_not_depend_on_how_the_text_was_cut(cuts):
    bounds = [0, *sorted(cuts), len(TEXT)]
    assert parse_in([TEXT[a:b] for a, b in zip(bounds, bounds[1:])]) == parse_in([TEXT])


def test_calls_are_read_out_and_malformed_blocks_stay_text():
    content, calls = parse_in([TEXT])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert content == "Let me check.  and <tool_call>not json</tool_call> done <tool"


def test_tool_choice_is_checked_against_the_tools():
    assert check_tools(TOOLS, "auto") == (tuple(TOOLS), None)
    assert check_tools(TOOLS, "required")[1] == "*"
    assert check_tools(TOOLS, {"type": "function", "function": {"name": "g"}})[1] == "g"
    for tools, choice, param in [(TOOLS, {"type": "function", "function": {"name": "h"}}, "tool_choice"),
                                 ([], "required", "tool_choice"), (TOOLS, "sometimes", "tool_choice"),
                                 ([{"type": "function"}], "auto", "tools[0]")]:
        with pytest.raises(ProtocolError) as e:
            check_tools(tools, choice)
        assert e.value.param == param


def test_the_call_grammar_takes_exactly_one_block_of_the_named_function():
    grammar = call_grammar(tuple(TOOLS), "f")
    good = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'.encode()
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
    m = llguidance.LLMatcher(lt, grammar)
    assert m.try_consume_tokens(list(good)) == len(good) and m.is_accepting()
    wrong = llguidance.LLMatcher(lt, grammar)
    bad = '<tool_call>\n{"name": "g"'.encode()
    assert wrong.try_consume_tokens(list(bad)) < len(bad)


class _Bytes:
    """One token per byte (256), plus an end token."""

    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)
