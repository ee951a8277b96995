"""Instruction prompts for MTP-head training, built offline from the Python standard library.

The stdlib sources on this machine are licence-clean (PSF) text; each public, documented function,
class, method and module yields candidate prompts from hand-written templates of three kinds:
`code` (write / test / rewrite code), `prose` (explain code or docs) and `general` (everyday chat
about a topic named by a module's one-line docstring). A fixed seed picks a balanced mix, so the
same stdlib gives the same prompts. No MLX here: this is pure text.
"""

from __future__ import annotations

import ast
import random
import re
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


# Everyday chat: the stdlib's docstrings name plenty of ordinary things (turtle, calendar, colour,
# mailbox, clock); these templates ask for everyday prose about them, so the head also learns the
# base's conversational register, not only its technical one.
EVERYDAY_TEMPLATES = {
    "story": "Write a short story that includes a {a} and a {b}.",
    "letter": "Write a friendly letter to a friend that mentions a {a}.",
    "advice": "Give me some practical, everyday advice related to {a}.",
    "poem": "Write a short poem about {a}.",
    "describe": "Describe a {a} to someone who has never seen one.",
    "facts": "What are some interesting facts about {a}?",
    "dialogue": "Write a short conversation between two friends about {a} and {b}.",
    "weekend": "Suggest a fun weekend activity that involves {a}.",
    "history": "Tell me a little about the history of {a}.",
    "product": "Write a short, cheerful product description for a {a}.",
    "word": "Explain the word '{a}' and use it in three example sentences.",
    "compare": "What is the difference between {a} and {b}, in everyday terms?",
}
_JARGON = {"self", "args", "kwargs", "dict", "tuple", "bool", "stdout", "stderr", "stdin", "none",
           "true", "false", "elif", "lambda", "def", "str", "int", "len", "repr", "init"}


def everyday_words(keep=None, root: Path | None = None, min_count: int = 3) -> list[str]:
    """Plain lowercase words of the stdlib's docstrings, most frequent first; `keep` may filter
    them further (e.g. to words the tokenizer knows whole, which are common English)."""
    counts: dict[str, int] = {}
    for item in documented_items(root):
        for word in re.findall(r"\b[a-z]{4,12}\b", item.doc):
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return [w for w in ranked if counts[w] >= min_count and w not in _JARGON and (keep is None or keep(w))]


def everyday_prompts(count: int, seed: int, keep=None, root: Path | None = None) -> list[Prompt]:
    """`count` distinct everyday-chat prompts, templates in turn, words drawn with the seed."""
    words = everyday_words(keep, root)
    rng = random.Random(seed)
    names = sorted(EVERYDAY_TEMPLATES)
    chosen, seen = [], set()
    while len(chosen) < count:
        name = names[len(chosen) % len(names)]
        a, b = rng.sample(words, 2)
        text = EVERYDAY_TEMPLATES[name].format(a=a, b=b)
        if text not in seen:
            seen.add(text)
            chosen.append(Prompt("everyday", name, text))
    rng.shuffle(chosen)
    return chosen


def recipe() -> dict:
    """What the prompts were built from, recorded beside the trained weights."""
    return {
        "source": str(stdlib_dir()),
        "python": sys.version.split()[0],
        "files": len(list(stdlib_dir().glob("*.py"))),
        "kinds": {"code": "write/test/rewrite/document code", "prose": "explain code and docs",
                  "general": "everyday chat about topics named by module docstrings",
                  "everyday": "everyday prose (stories, letters, advice) about docstring words"},
    }
