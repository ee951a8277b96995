"""Instruction prompts for MTP-head training, built offline from the Python standard library.

The stdlib sources on this machine are licence-clean (PSF) text; each public, documented function,
class, method and module yields candidate prompts from hand-written templates of three kinds:
`code` (write / test / rewrite code), `prose` (explain code or docs) and `general` (everyday chat
about a topic named by a module's one-line docstring). A fixed seed picks a balanced mix, so the
same stdlib gives the same prompts. No MLX here: this is pure text.
"""

from __future__ import annotations

import ast
import json
import random
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_SNIPPET_CHARS = 1200  # keeps a prompt near 350 tokens: prefill is the costly part here
MAX_DOC_CHARS = 700


@dataclass(frozen=True)
class Documented:
    module: str
    name: str  # "" for the module itself; "Class.method" for methods
    signature: str
    doc: str
    source: str


@dataclass(frozen=True)
class Prompt:
    kind: str  # code | prose | general
    template: str
    text: str


def stdlib_dir() -> Path:
    """The directory of this interpreter's pure-Python standard library."""
    return Path(ast.__file__).parent


def documented_items(root: Path | None = None) -> Iterator[Documented]:
    """Every documented public module, top-level function/class and method, in file order."""
    for path in sorted((root or stdlib_dir()).glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = path.stem
        if doc := ast.get_docstring(tree):
            yield Documented(module, "", "", doc, "")
        yield from _definitions(module, source, tree.body, prefix="")


def _definitions(module: str, source: str, body: list, prefix: str) -> Iterator[Documented]:
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if doc:
            signature = ast.unparse(node.args) if isinstance(node, ast.FunctionDef) else ""
            yield Documented(module, prefix + node.name, signature, doc, _source_of(source, node))
        if isinstance(node, ast.ClassDef) and not prefix:
            yield from _definitions(module, source, node.body, prefix=node.name + ".")


def _source_of(source: str, node: ast.AST) -> str:
    """The node's source, dedented; "" where dedenting breaks it (strings at column 0)."""
    # Methods come indented: restore the first line's indent, then dedent the whole.
    text = textwrap.dedent(" " * node.col_offset + (ast.get_source_segment(source, node) or ""))
    try:
        ast.parse(text)
    except SyntaxError:
        return ""
    return text


def first_sentence(doc: str) -> str:
    paragraph = doc.strip().split("\n\n")[0].replace("\n", " ")
    sentence = paragraph.split(". ")[0].strip().rstrip(".")
    return " ".join(sentence.split())


def _snippet(item: Documented) -> str | None:
    if not item.source or len(item.source) > MAX_SNIPPET_CHARS:
        return None
    return item.source


def _without_docstring(item: Documented) -> str | None:
    code = _snippet(item)
    if code is None or not item.signature and "def " not in code:
        return None
    tree = ast.parse(code)
    node = tree.body[0]
    node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def candidates(item: Documented) -> Iterator[Prompt]:
    """All prompts one documented item supports, each tagged with its template name."""
    qualified = f"{item.module}.{item.name}" if item.name else item.module
    summary = first_sentence(item.doc)
    doc = item.doc.strip()[:MAX_DOC_CHARS]
    code = _snippet(item)
    if not item.name:
        if summary:
            yield Prompt("prose", "module_purpose", f"What is the Python `{item.module}` module for?")
            yield Prompt("general", "topic_beginner",
                         f"Explain the idea behind this to a beginner: {summary}.")
            yield Prompt("general", "topic_tips",
                         f"Give me three practical tips related to this topic: {summary}.")
        return
    short = item.name.split(".")[-1]
    if summary and item.signature is not None and "." not in item.name and item.signature:
        yield Prompt("code", "write_function",
                     f"Write a Python function `{short}({item.signature})` that "
                     f"{_lower_first(summary)}.")
    yield Prompt("code", "usage_example", f"Show a short example of how to use `{qualified}` in Python.")
    if code:
        yield Prompt("prose", "explain_code", f"Explain what this Python code does:\n\n```python\n{code}\n```")
        yield Prompt("code", "unit_tests", f"Write unit tests for this Python code:\n\n```python\n{code}\n```")
        yield Prompt("code", "rewrite", f"Rewrite this Python code to be simpler and easier to read:\n\n"
                                        f"```python\n{code}\n```")
    if (bare := _without_docstring(item)) is not None:
        yield Prompt("code", "write_docstring", f"Write a docstring for this Python function:\n\n"
                                                f"```python\n{bare}\n```")
    yield Prompt("prose", "what_for", f"What is `{short}` in Python's `{item.module}` module used for?")
    if len(doc) > 80:
        yield Prompt("prose", "summarize_doc", f"Summarize this documentation in two sentences:\n\n{doc}")
        yield Prompt("general", "plain_words", f"Explain this in plain words, as if to a friend:\n\n{doc}")


def build_prompts(count: int, seed: int, root: Path | None = None) -> list[Prompt]:
    """`count` distinct prompts, templates taken in turn so every template is represented."""
    by_template: dict[str, list[Prompt]] = {}
    for item in documented_items(root):
        for prompt in candidates(item):
            by_template.setdefault(prompt.template, []).append(prompt)
    rng = random.Random(seed)
    queues = []
    for name in sorted(by_template):
        pool = by_template[name]
        rng.shuffle(pool)
        queues.append(pool)
    chosen, seen = [], set()
    while len(chosen) < count and any(queues):
        for pool in queues:
            if pool and len(chosen) < count:
                prompt = pool.pop()
                if prompt.text not in seen:
                    seen.add(prompt.text)
                    chosen.append(prompt)
    rng.shuffle(chosen)
    return chosen


# Everyday chat: templates asking for everyday prose about ordinary things, so the head also learns
# the base's conversational register, not only its technical one. The topics are our own list.
EVERYDAY_TEMPLATES = {
    "story": "Write a short story that includes a {a} and a {b}.",
    "letter": "Write a friendly letter to a friend that mentions a {a}.",
    "advice": "Give me some practical, everyday advice related to {a}.",
    "poem": "Write a short poem about {a}.",
    "describe": "Describe {a} to someone who has never seen it.",
    "facts": "What are some interesting facts about {a}?",
    "dialogue": "Write a short conversation between two friends about {a} and {b}.",
    "weekend": "Suggest a fun weekend activity that involves {a}.",
    "history": "Tell me a little about the history of {a}.",
    "product": "Write a short, cheerful product description for a {a}.",
    "steps": "How do I get started with {a}? Give me a few simple steps.",
    "compare": "What is the difference between {a} and {b}, in everyday terms?",
}
EVERYDAY_TOPICS = """
bicycle garden kitchen umbrella lighthouse library bakery river mountain forest island desert
volcano rainbow thunderstorm snowfall sunrise sunset moon comet telescope camera guitar piano violin
drum choir painting sculpture museum theatre cinema novel poetry newspaper postcard letter stamp
calendar clock compass map passport suitcase train airplane sailboat canoe bridge tunnel castle
village city market restaurant cafe picnic birthday wedding holiday festival parade marathon
football tennis swimming chess puzzle kite balloon candle lantern blanket pillow teapot coffee tea
bread cheese honey apple orange strawberry tomato potato carrot pumpkin soup salad pasta pizza
rice noodles chocolate cookie cake sandwich breakfast dinner recipe vegetable fruit herb spice
dog cat horse rabbit parrot owl eagle dolphin whale turtle butterfly bee ant elephant giraffe
penguin fox wolf bear squirrel hedgehog aquarium zoo farm orchard vineyard meadow beach harbour
ocean lake waterfall cave glacier weather season autumn winter spring summer rain wind snow
friendship family neighbour teacher doctor nurse farmer baker firefighter pilot astronaut
scientist artist musician gardener carpenter sleep exercise walking running yoga meditation
hobby habit budget savings shopping cleaning laundry recycling composting moving homework exam
school university job interview meeting presentation teamwork kindness patience gratitude
curiosity courage laughter memory dream robot computer phone email internet website password
battery lamp mirror window door staircase chair table bookshelf notebook pencil crayon backpack
""".split()


# Everyday programming tasks, composed from our own lists: what users ask a small code assistant.
CODE_TASK_TEMPLATES = {
    "function": "Write a Python function that {verb} {thing}.",
    "explain": "Explain step by step how to write Python code that {verb} {thing}.",
    "tested": "Write a Python function that {verb} {thing}, with a few example calls.",
    "algorithm": "Implement {algorithm} in Python and explain how it works.",
    "class": "Write a Python class for {structure} with the usual methods.",
    "fix": "What is a common mistake when writing Python code that {verb} {thing}, and how do I avoid it?",
}
CODE_VERBS = """reverses|sorts|counts the items of|removes duplicates from|finds the largest value in|sums the
numbers in|filters the even numbers out of|groups the words of|validates|parses|splits into chunks|
merges|compresses|encrypts with a Caesar cipher|finds the longest word in|capitalises every word of|
rotates|shuffles|searches|normalises""".replace("\n", " ").split("|")
CODE_THINGS = """a list of integers|a string|a dictionary of scores|a list of names|a text file|a CSV file|
a JSON document|a nested list|a list of dates|an email address|a URL|a sentence|a matrix|a set of tags|
a list of prices|a phone number|a log file|a list of tuples""".replace("\n", " ").split("|")
CODE_ALGORITHMS = """bubble sort|insertion sort|selection sort|quicksort|merge sort|heap sort|counting sort|
breadth-first search|depth-first search|Dijkstra's algorithm|the sieve of Eratosthenes|Euclid's algorithm
for the greatest common divisor|a binary search tree insert|run-length encoding|Kadane's algorithm|
matrix multiplication|a prefix sum array|the two-pointer technique|memoised recursion|a sliding window
maximum""".replace("\n", " ").split("|")
CODE_STRUCTURES = """a stack|a queue|a linked list|a binary tree|a bank account|a to-do list|a shopping cart|
a library catalogue|a deck of cards|a priority queue|a simple calculator|a temperature converter|an
inventory|a playlist|a student gradebook|a matrix|a 2D point|a rectangle|a timer|a counter""".replace("\n", " ").split("|")


def code_task_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` distinct programming-task prompts, template and parts drawn with the seed (the
    algorithm and class templates run out after 20 each); none overlapping a held-out prompt."""
    rng = random.Random(seed)
    names = sorted(CODE_TASK_TEMPLATES)

    def draw(_: int) -> Prompt:
        name = rng.choice(names)
        text = CODE_TASK_TEMPLATES[name].format(
            verb=" ".join(rng.choice(CODE_VERBS).split()), thing=" ".join(rng.choice(CODE_THINGS).split()),
            algorithm=" ".join(rng.choice(CODE_ALGORITHMS).split()),
            structure=" ".join(rng.choice(CODE_STRUCTURES).split()))
        return Prompt("code-task", name, text)

    return _distinct(count, rng, draw)


def everyday_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` distinct everyday-chat prompts, templates in turn, topics drawn with the seed;
    none overlapping a held-out prompt."""
    rng = random.Random(seed)
    names = sorted(EVERYDAY_TEMPLATES)

    def draw(index: int) -> Prompt:
        name = names[index % len(names)]
        a, b = rng.sample(EVERYDAY_TOPICS, 2)
        return Prompt("everyday", name, EVERYDAY_TEMPLATES[name].format(a=a, b=b))

    return _distinct(count, rng, draw)


def _distinct(count: int, rng: random.Random, draw) -> list[Prompt]:
    """Up to `count` prompts from draw(number kept so far), each text once and none equal to,
    inside or containing a held-out prompt (at most 100 draws per prompt); shuffled with rng."""
    held_out = held_out_prompts()
    chosen, seen = [], set()
    for _ in range(100 * count):
        if len(chosen) == count:
            break
        prompt = draw(len(chosen))
        if prompt.text not in seen and not any(h in prompt.text or prompt.text in h for h in held_out):
            seen.add(prompt.text)
            chosen.append(prompt)
    rng.shuffle(chosen)
    return chosen


HELD_OUT = Path(__file__).resolve().parents[1] / "tests" / "prompts"


def held_out_prompts() -> list[str]:
    """The benchmark's held-out prompts (tests/prompts/*.jsonl), which training must never see."""
    return [json.loads(line)["prompt"] for path in sorted(HELD_OUT.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def recipe() -> dict:
    """What the prompts were built from, recorded beside the trained weights."""
    return {
        "source": str(stdlib_dir()),
        "python": sys.version.split()[0],
        "files": len(list(stdlib_dir().glob("*.py"))),
        "kinds": {"code": "write/test/rewrite/document code", "prose": "explain code and docs",
                  "general": "everyday chat about topics named by module docstrings",
                  "everyday": "everyday prose (stories, letters, advice) about common topics",
                  "chat": "conversational questions: how and why, plans, recipes, advice, messages",
                  "program": "programming requests: functions with constraints, scripts, classes, "
                             "concepts, errors, JavaScript, SQL, shell"},
    }
