"""The package's floors: every module of src/hpcllm imports only from its own floor or the
floors below it, and no import (function-level ones included) closes a circle.

Read with ``ast``, nothing imported. A module's floor is that of the longest entry of
FLOORS naming it or a package above it; within ``hpcllm.training`` the rooms stand in the
same way on TRAINING_ROOMS.
"""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

SRC = REPO / "src"

# Bottom first. A module may import from its own floor and the floors below it.
FLOORS: list[tuple[str, ...]] = [
    # utilities: files, logs, progress, failure classes, clusters and their launch
    (
        "hpcllm",  # the package's own __init__
        "hpcllm.atomic",
        "hpcllm.diskspace",
        "hpcllm.offline",
        "hpcllm.logs",
        "hpcllm.progress",
        "hpcllm.commandline",
        "hpcllm.work_time",
        "hpcllm.plan_cost",
        "hpcllm.failures",
        "hpcllm.clusters",
        "hpcllm.containers",
        "hpcllm.launch",
        "hpcllm.slurm_pending",
    ),
    # what training and the benchmarks share: presets, layout and memory, Megatron's flags
    ("hpcllm.models",),
    ("hpcllm.text", "hpcllm.vision"),
    ("hpcllm.bench",),
    # the config's checks (they read benchmark experiments); the site probe, whose record
    # training's chain reads
    ("hpcllm.configuration", "hpcllm.preflight.probe", "hpcllm.preflight.inside"),
    ("hpcllm.training",),
    # what runs on trained models or ahead of training and benchmarks
    ("hpcllm.export", "hpcllm.evaluation", "hpcllm.preflight"),
    ("hpcllm.cli", "hpcllm.results_page", "hpcllm.gpu_check", "hpcllm.__main__"),
]

# The rooms of hpcllm.training, bottom first.
TRAINING_ROOMS: list[tuple[str, ...]] = [
    ("hpcllm.training",),  # its __init__
    ("hpcllm.training.checkpoints",),
    ("hpcllm.training.plan",),
    ("hpcllm.training.engines",),
    # its chain's old command line (python -m hpcllm.training.chain), for queued jobs
    ("hpcllm.training.campaign", "hpcllm.training.chain"),
]


def modules(src: Path = SRC) -> dict[str, Path]:
    found = {}
    for path in sorted((src / "hpcllm").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The hpcllm modules ``name`` imports anywhere in it (``from p import m`` names
    module ``p.m`` where that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                full = f"{module}.{a.name}"
                out.add(full if full in known else module)
    return {m for m in out if m == "hpcllm" or m.startswith("hpcllm.")}


def graph(src: Path = SRC) -> dict[str, set[str]]:
    known = modules(src)
    return {name: imports(name, path, known) - {name} for name, path in known.items()}


def level(name: str, floors: list[tuple[str, ...]]) -> int | None:
    best, where = -1, None
    for i, floor in enumerate(floors):
        for entry in floor:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > best:
                best, where = len(entry), i
    return where


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[str]:
    wrong = []
    for name, targets in sorted(edges.items()):
        mine = level(name, floors)
        for target in sorted(targets):
            theirs = level(target, floors)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{name} (floor {mine}) imports {target} (floor {theirs})")
    return wrong


def test_every_module_has_a_floor():
    lost = [name for name in modules() if level(name, FLOORS) is None]
    assert not lost, f"add to FLOORS: {lost}"
    rooms = [
        n for n in modules() if n.startswith("hpcllm.training") and level(n, TRAINING_ROOMS) is None
    ]
    assert not rooms, f"add to TRAINING_ROOMS: {rooms}"


def test_no_module_imports_from_a_higher_floor():
    wrong = upward(graph(), FLOORS)
    assert not wrong, "\n".join(wrong)


def test_no_training_room_imports_from_a_higher_room():
    edges = {
        name: {t for t in targets if t.startswith("hpcllm.training")}
        for name, targets in graph().items()
        if name.startswith("hpcllm.training")
    }
    wrong = upward(edges, TRAINING_ROOMS)
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_between_modules():
    found = circles(graph())
    assert not found, found


def test_no_import_circle_between_training_rooms():
    def room(name: str) -> str:
        return ".".join(name.split(".")[:3])

    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        if name.startswith("hpcllm.training."):
            edges.setdefault(room(name), set()).update(
                room(t)
                for t in targets
                if t.startswith("hpcllm.training.") and room(t) != room(name)
            )
    found = circles(edges)
    assert not found, found


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path):
    """The helpers themselves: a package with a circle and an import from above."""
    pkg = tmp_path / "hpcllm"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from hpcllm.low import b\n")
    (pkg / "low" / "b.py").write_text("from . import a\nfrom hpcllm.high import c\n")
    (pkg / "high.py").write_text("c = 1\n")
    edges = graph(tmp_path)
    assert edges["hpcllm.low.b"] == {"hpcllm.low.a", "hpcllm.high"}
    assert circles(edges) == [["hpcllm.low.a", "hpcllm.low.b"]]
    floors = [("hpcllm", "hpcllm.low"), ("hpcllm.high",)]
    assert upward(edges, floors) == ["hpcllm.low.b (floor 0) imports hpcllm.high (floor 1)"]
