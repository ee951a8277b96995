"""metrale bench prompt-cache: time to first token and total time per turn, prompt cache on vs off.

One fresh `metrale serve` subprocess on loopback with the default settings (the default model, its
drafter and gate), driven by the official openai client with streamed greedy chat completions.
Two workloads, each turn sent twice back to back, once reusing the cache and once with
`"cache_prompt": false` (computed from scratch, kept nowhere), the order alternating per turn so a
slow spell of this shared machine hits both alike:
- chat: an 8-turn conversation; each turn resends the whole conversation (every earlier question
  and answer) plus a new question.
- agent: a loop under a long fixed system prompt (tools and rules); each step resends it with the
  task, every earlier action and the new tool result.
A salt per run keeps earlier runs' entries out. Both copies of a turn must answer the same text
(greedy output does not depend on the cache); `identical` counts those that do.

Columns: prompt and cached tokens (usage.prompt_tokens_details.cached_tokens) of the cached turn,
TTFT (request sent to first content chunk) and total seconds each way, and on/off ratios. Last
line: ttft_ratio_last_turn=R (cached over uncached TTFT of each workload's last turn, the worse of
the two; target <= 0.3) total_speedup=R (summed uncached over summed cached seconds, every turn)
hit_rate=H (the share of the cached turns' prompt tokens that came from the cache) identical=0|1.
"""

from __future__ import annotations

import argparse
import shlex
import time
import uuid
from dataclasses import dataclass

from runtime.bench.common import table

QUESTIONS = [
    "I want to start baking bread at home. What equipment do I need?",
    "Which flour should I buy for a first loaf?",
    "How long should the dough rise, and how do I know it is ready?",
    "What oven temperature works best for a simple white loaf?",
    "My loaf came out dense. What might have gone wrong?",
    "How do I store the bread so it stays fresh for a few days?",
    "Can I freeze bread, and how do I thaw it well?",
    "Suggest a simple variation to try for my second loaf.",
]
TOOLS = [("search_files", "find files whose name or content matches a pattern", "pattern, folder"),
         ("read_file", "read a text file and return its lines with numbers", "path, first_line, last_line"),
         ("write_file", "replace a file's content with the given text", "path, text"),
         ("run_tests", "run the project's tests and return failures with their tracebacks", "selection"),
         ("list_folder", "list the files and folders under a path", "path, depth"),
         ("git_diff", "show the uncommitted changes of the working tree", "paths"),
         ("ask_user", "ask the user a question and wait for the answer", "question")]
RULES = ["Think about which single tool call moves the task forward, then make exactly that call.",
         "Reply with one line: the tool name followed by its arguments as JSON.",
         "Never invent file contents: read a file before you change it.",
         "Run the tests after every change and read their output before the next step.",
         "Keep changes small; one concern per change.",
         "If a step fails twice, ask the user instead of guessing.",
         "Stop with the word DONE once the tests pass and the task is complete."]
TASK = "The function parse_date in utils/dates.py rejects ISO dates with a trailing Z. Fix it."
OBSERVATIONS = [
    "search_files returned: utils/dates.py, tests/test_dates.py",
    "read_file returned 40 lines; line 12: fmt = '%Y-%m-%dT%H:%M:%S'",
    "run_tests returned: 1 failed: test_parse_date_with_zulu (ValueError: unconverted data remains: Z)",
    "write_file returned: ok, 41 lines written",
    "run_tests returned: all 12 tests passed",
    "git_diff returned: utils/dates.py: +1 -1",
]


@dataclass(frozen=True)
class Timed:
    text: str
    ttft: float
    total: float
    prompt_tokens: int
    cached_tokens: int


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from kernels.default_model import ensure_default_model
    from runtime.bench._served import ServedProcess, openai_client, warm_up

    extra = shlex.split(args.extra_serve_args)
    with ServedProcess(ensure_default_model(), extra) as server:
        print(f"server: {shlex.join(server.command('<fresh temp dir>'))}", flush=True)
        client = openai_client(server.url)
        warm_up(client, args.max_tokens, plain_too=False)
        salt = uuid.uuid4().hex
        runs = {"chat": chat_turns(client, args.turns, args.max_tokens, salt),
                "agent": agent_steps(client, args.agent_steps, args.max_tokens, salt)}
    print(report(runs))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metrale bench prompt-cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=8, help="turns of the chat conversation (at most 8)")
    p.add_argument("--agent-steps", type=int, default=6, help="steps of the agent loop (at most 6)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--extra-serve-args", default="", help="appended to the server's command line")
    return p


def chat_turns(client, turns: int, max_tokens: int, salt: str) -> list[tuple[Timed, Timed]]:
    history: list[dict] = []
    pairs = []
    for i, question in enumerate(QUESTIONS[:turns]):
        messages = history + [{"role": "user", "content": question}]
        pairs.append(both(client, messages, max_tokens, salt, cached_first=i % 2 == 0))
        history = messages + [{"role": "assistant", "content": pairs[-1][0].text}]
    return pairs


def agent_steps(client, steps: int, max_tokens: int, salt: str) -> list[tuple[Timed, Timed]]:
    messages = [{"role": "system", "content": agent_system_prompt()}, {"role": "user", "content": TASK}]
    pairs = []
    for i, observation in enumerate(OBSERVATIONS[:steps]):
        pairs.append(both(client, messages, max_tokens, salt, cached_first=i % 2 == 0))
        messages = messages + [{"role": "assistant", "content": pairs[-1][0].text},
                               {"role": "user", "content": f"Tool result: {observation}"}]
    return pairs


def agent_system_prompt() -> str:
    tools = "\n".join(f"- {name}({params}): {what}." for name, what, params in TOOLS)
    rules = "\n".join(f"{i}. {rule}" for i, rule in enumerate(RULES, 1))
    return (f"You are a coding agent working in a Python repository.\nYou can call these tools:\n{tools}\n"
            f"Rules:\n{rules}\n") * 3  # a long prompt, as agents' are: the same block thrice


def both(client, messages, max_tokens: int, salt: str, cached_first: bool) -> tuple[Timed, Timed]:
    """(with the cache, without it) for one turn, in the given order."""
    if cached_first:
        on = timed(client, messages, max_tokens, salt, True)
        return on, timed(client, messages, max_tokens, salt, False)
    off = timed(client, messages, max_tokens, salt, False)
    return timed(client, messages, max_tokens, salt, True), off


def timed(client, messages, max_tokens: int, salt: str, cache: bool) -> Timed:
    started = time.perf_counter()
    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"cache_prompt": cache, "cache_salt": salt})
    parts, first, usage = [], None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    total = time.perf_counter() - started
    details = usage.prompt_tokens_details
    return Timed("".join(parts), (first or time.perf_counter()) - started, total, usage.prompt_tokens,
                 details.cached_tokens if details and details.cached_tokens else 0)


def report(runs: dict[str, list[tuple[Timed, Timed]]]) -> str:
    lines, last_ratios = [], []
    for name, pairs in runs.items():
        rows = [[i + 1, on.prompt_tokens, on.cached_tokens, on.ttft, off.ttft, on.ttft / off.ttft, on.total,
                 off.total, off.total / on.total, on.text == off.text] for i, (on, off) in enumerate(pairs)]
        lines += [f"\n{name}", table(["turn", "prompt", "cached", "ttft_on", "ttft_off", "ttft_ratio", "total_on",
                                      "total_off", "speedup", "identical"], rows)]
        last_ratios.append(pairs[-1][0].ttft / pairs[-1][1].ttft)
    every = [pair for pairs in runs.values() for pair in pairs]
    speedup = sum(off.total for _, off in every) / sum(on.total for on, _ in every)
    hit_rate = sum(on.cached_tokens for on, _ in every) / sum(on.prompt_tokens for on, _ in every)
    identical = all(on.text == off.text for on, off in every)
    lines.append(f"ttft_ratio_last_turn={max(last_ratios):.3f} total_speedup={speedup:.3f} "
                 f"hit_rate={hit_rate:.3f} identical={int(identical)}")
    return "\n".join(lines)
