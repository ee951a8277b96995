"""metrale bench structured: JSON-schema answers (response_format) on held-out prompts, default
model, width 1, greedy: plain decode vs speculation vs speculation whose drafts are the grammar's
forced tokens wherever it forces some (free drafts: no drafter forward for that step), and plain
decode that takes those forced runs in one forward (disable_mtp on the server with forced drafts).

Through the served actor system in this process (runtime/bench/_inprocess.py): two Systems as
`metrale serve --drafter D --num-draft-tokens K --mtp-gate force --spec-cost-model off`, one with
`--no-forced-drafts`; plain decode is a request with disable_mtp on the latter (on the former: plain
with forced runs). On each prompt the four run back to back in a rotated order; every answer must
parse, validate against its schema (jsonschema) and be byte-identical across the four. Forwards are target forwards (prefill, plain and verify steps; a
drafter's own forwards are not counted). Prints tok/s, speedup over plain and forwards per token.
Last line: structured_speedup=R (forced drafts over plain, pooled tok/s) forwards_per_token=F (with
forced drafts) plain_forced_speedup=R (plain with forced runs over plain) valid=1 (every answer
valid and identical; 0 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from runtime.bench.common import table

# Held out: none of these schemas or questions is in the tests.
TASKS = [
    ("Give me a recipe for pancakes as JSON.",
     {"type": "object", "additionalProperties": False, "required": ["title", "servings", "ingredients"],
      "properties": {"title": {"type": "string", "maxLength": 60}, "servings": {"type": "integer", "minimum": 1},
                     "ingredients": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 6}}}),
    ("Describe today's weather in Paris as JSON.",
     {"type": "object", "additionalProperties": False, "required": ["city", "temperature_c", "conditions", "windy"],
      "properties": {"city": {"type": "string", "maxLength": 40}, "temperature_c": {"type": "number"},
                     "conditions": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}, "windy": {"type": "boolean"}}}),
    ("List three books worth reading, as JSON.",
     {"type": "object", "additionalProperties": False, "required": ["books"],
      "properties": {"books": {"type": "array", "maxItems": 3, "items": {
          "type": "object", "additionalProperties": False, "required": ["title", "author", "year"],
          "properties": {"title": {"type": "string", "maxLength": 60}, "author": {"type": "string", "maxLength": 40},
                         "year": {"type": "integer"}}}}}}),
    ("Make a to-do list for moving house, as JSON.",
     {"type": "object", "additionalProperties": False, "required": ["tasks"],
      "properties": {"tasks": {"type": "array", "maxItems": 5, "items": {
          "type": "object", "additionalProperties": False, "required": ["task", "done"],
          "properties": {"task": {"type": "string", "maxLength": 50}, "done": {"type": "boolean"}}}}}}),
]
PLAIN, SPEC, FORCED, PLAIN_FORCED = "plain", "speculative", "forced_drafts", "plain_forced_runs"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="metrale bench structured", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=len(TASKS), help=f"tasks to run (at most {len(TASKS)})")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3, help="draft tokens per step")
    parser.add_argument("--drafter", default="auto", help="auto: the shipped MTP head where found, else ngram")
    args = parser.parse_args(argv)
    return asyncio.run(run(TASKS[:args.prompts], args.max_tokens, args.k, args.drafter))


async def run(tasks, max_tokens: int, k: int, drafter: str) -> int:
    from kernels.default_model import ensure_default_model
    from kernels.heads import find_mtp_head
    from runtime.bench._inprocess import fixed_depth, served_all
    from runtime.config import load_config, override

    model_dir = ensure_default_model()
    if drafter == "auto":
        drafter = "mtp" if find_mtp_head(model_dir) is not None else "ngram"
    spec = fixed_depth(load_config(), drafter, k)
    configs = {SPEC: override(spec, "spec", forced_drafts=False), FORCED: override(spec, "spec", forced_drafts=True)}
    async with served_all(configs, model_dir) as clients:
        clients = {PLAIN: clients[SPEC], **clients, PLAIN_FORCED: clients[FORCED]}
        await sweep(clients, tasks[:1], 16, check=False)  # untimed warm-up: each system builds its paths once
        runs, valid = await sweep(clients, tasks, max_tokens)
    return report(runs, valid, drafter, k)


async def sweep(clients: dict, tasks, max_tokens: int, check: bool = True) -> tuple[dict[str, list], bool]:
    """Every configuration on every task, rotated per task; whether every answer was valid and alike."""
    import jsonschema

    from runtime.bench._inprocess import plain
    from runtime.grammar import grammar_for
    from runtime.messages import SamplingParams

    runs: dict[str, list] = {name: [] for name in clients}
    valid = True
    for i, (question, schema) in enumerate(tasks):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=grammar_for(fmt))
        names = list(clients)[i % len(clients):] + list(clients)[:i % len(clients)]
        for name in names:
            asked = plain(params) if name in (PLAIN, PLAIN_FORCED) else params
            runs[name].append(await clients[name].generate(question, asked))
        answers = {name: runs[name][-1] for name in clients}
        texts = {clients[PLAIN].codec.decode(r.tokens) for r in answers.values()}
        if not check:
            continue
        try:
            jsonschema.validate(json.loads(next(iter(texts))), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            print(f"task {i}: answer invalid: {e}")
            valid = False
        valid = valid and len(texts) == 1 and all(r.usage.completion_tokens for r in answers.values())
    return runs, valid


def forwards(result) -> int:
    """Target forwards of one answer: its prefill, then each plain or verify step."""
    return 1 + result.receipt.plain_steps + result.receipt.verify_steps


def report(runs: dict[str, list], valid: bool, drafter: str, k: int) -> int:
    rows, rates, per_token = [], {}, {}
    for name, results in runs.items():
        tokens = sum(len(r.tokens) for r in results)
        seconds = sum(r.seconds for r in results)
        fwd = sum(forwards(r) for r in results)
        drafted = sum(r.receipt.drafted_tokens for r in results)
        accepted = sum(r.receipt.accepted_tokens for r in results)
        rates[name], per_token[name] = tokens / seconds, fwd / tokens
        drafting = name in (SPEC, FORCED)
        rows.append([name, drafter if drafting else "-", k if drafting else 0, tokens, round(seconds, 2),
                     round(rates[name], 2), round(rates[name] / rates.get(PLAIN, rates[name]), 3), fwd,
                     round(per_token[name], 3), f"{accepted}/{drafted}"])
    print(table(["config", "drafter", "K", "tokens", "seconds", "tok_s", "speedup", "forwards",
                 "forwards_per_token", "accepted/drafted"], rows))
    print(f"structured_speedup={rates[FORCED] / rates[PLAIN]:.3f} forwards_per_token={per_token[FORCED]:.3f} "
          f"plain_forced_speedup={rates[PLAIN_FORCED] / rates[PLAIN]:.3f} valid={int(valid)}")
    return 0 if valid else 1
