"""No code outside an actor touches its containers: peers send it messages (asks for replies)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS = ("dict", "list", "set", "deque", "Counter", "OrderedDict", "defaultdict")
# Files that are part of one actor (its own module split for size).
PARTS = {"scheduler": {"scheduler.py", "scheduler_spec.py", "scheduler_hyper.py", "scheduler_tree.py"}}


def container_attributes(path: Path) -> set[str]:
    """self.X assigned a container in the module's classes (the actor's own state)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            is_container = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) in CONTAINERS)
            for t in targets:
                if is_container and isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self":
                    names.add(t.attr)
    return names


def reaches(path: Path, actor: str, attributes: set[str]) -> list[str]:
    """`<...>.actor.attr` or `actor.attr` expressions in a file outside the actor."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in attributes:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == actor:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {actor}.{node.attr}")
    return found


def test_no_module_outside_an_actor_reaches_its_containers():
    sources = [p for d in ("runtime", "actors", "kernels") for p in (ROOT / d).rglob("*.py")]
    problems = []
    for module in (ROOT / "actors").glob("*.py"):
        actor = module.stem
        if actor.startswith("_") or any(module.name in part for owner, part in PARTS.items() if owner != actor):
            continue
        attributes = container_attributes(module)
        own = PARTS.get(actor, {module.name})
        for path in sources:
            if not (path.parent.name == "actors" and path.name in own):
                problems += reaches(path, actor, attributes)
    assert not problems, problems


def test_the_check_sees_a_reach():
    attributes = container_attributes(ROOT / "actors" / "scheduler.py")
    assert {"waiting", "active"} <= attributes
    probe = ROOT / "tests" / "unit" / "_reach_probe.py"
    probe.write_text("def f(system):\n    return system.scheduler.waiting\n")
    try:
        assert reaches(probe, "scheduler", attributes)
    finally:
        probe.unlink()
