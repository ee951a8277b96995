"""Backpressure cannot deadlock: the graph of awaiting sends between actors has no cycle.

An edge A -> B is a `tell` or `ask` to B in A's code: A may wait on B's bounded inbox (and, for an
ask, on B's reply). A cycle of such waits can block every actor in it at once when the inboxes
fill, so none may exist. Non-blocking paths (Actor.tell_nowait, Admission.release) are not edges.
"""

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The attribute an actor keeps a peer under -> the peer's actor name.
PEERS = {"owner": "model_owner", "streamer": "streamer", "telemetry": "telemetry", "scheduler": "scheduler",
         "admission": "admission", "drafter": "drafter", "verifier": "verifier"}
SENDS = ("tell", "ask")


def actor_of(path: Path) -> str:
    """The actor a file of actors/ belongs to (the scheduler's parts count as the scheduler)."""
    name = path.stem
    return "scheduler" if name.startswith("scheduler") else PEERS.get(name, name)


def send_edges(path: Path) -> set[tuple[str, str]]:
    """(sender, receiver) for every `<...>.peer.tell(...)` / `.ask(...)` call in the file."""
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SENDS:
            receiver = node.func.value
            if isinstance(receiver, ast.Call) and getattr(receiver.func, "id", None) == "super":
                continue  # an actor's own ask/tell override calling Actor's: not a send to a peer
            peer = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", None)
            assert peer in PEERS, f"{path.name}:{node.lineno}: a send to {peer!r}, a peer this test does not know"
            edges.add((actor_of(path), PEERS[peer]))
    return edges


def send_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "actors").glob("*.py")):
        for sender, receiver in send_edges(path):
            graph.setdefault(sender, set()).add(receiver)
    return graph


def assert_acyclic(graph: dict[str, set[str]]) -> None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"a cycle of awaiting sends between actors: {' -> '.join(e.args[1])}") from None


def test_the_actors_send_graph_is_acyclic():
    graph = send_graph()
    assert graph["scheduler"] >= {"model_owner", "streamer", "telemetry"}  # the scan found the real sends
    assert graph["admission"] >= {"scheduler"}
    assert_acyclic(graph)


def test_the_slot_release_is_not_a_send():
    assert "admission" not in send_graph().get("streamer", set())


def test_a_cycle_is_caught():
    try:
        assert_acyclic({"scheduler": {"streamer"}, "streamer": {"admission"}, "admission": {"scheduler"}})
    except AssertionError as e:
        assert "scheduler" in str(e)
    else:
        raise AssertionError("the cycle was not found")
