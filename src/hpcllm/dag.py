"""A readable picture of a big plan from Snakemake's ``--dag``.

``--dag`` draws one box per job: a sweep's benchmark points, an experiment's segments and
the tokenize batches stand side by side or in long rows (the JUWELS plan of the 800M
model with its evaluation and the language sweep, 53 jobs, drew 6,229 px wide).
:func:`fold` draws the jobs of one rule that wait for the same jobs of other rules as
one box, with their number and each wildcard's first and last value; a loop on the box
says that some of them wait for others. ``--rulegraph`` is smaller still: one box per
rule (docs/clusters.md).

    snakemake --profile profiles/juwels --dag | hpcllm dag | dot -Tsvg > dag.svg
"""

from __future__ import annotations

import re
from collections import defaultdict

NODE = re.compile(r'^\s*(\d+)\[label = "((?:[^"\\]|\\.)*)"(.*)\];\s*$')
EDGE = re.compile(r"^\s*(\d+) -> (\d+)\s*$")


def _natural(value: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", value)]


def _values(seen: set[str]) -> str:
    """A wildcard's values in short: dotted values part by part (``a.{b,c}.n1…n8``), others
    as first…last."""
    parts = [v.split(".") for v in seen]
    if len({len(p) for p in parts}) > 1:
        parts = [[v] for v in seen]
    shown = []
    for column in zip(*parts):
        distinct = sorted(set(column), key=_natural)
        if len(distinct) == 1:
            shown.append(distinct[0])
        elif len(distinct) <= 3:
            shown.append("{" + ",".join(distinct) + "}")
        else:
            shown.append(f"{distinct[0]}…{distinct[-1]}")
    return ".".join(shown)


def _label(labels: list[list[str]]) -> str:
    """A folded box's label: the rule, how many jobs, each wildcard's values in short."""
    values: dict[str, set[str]] = defaultdict(set)
    for label in labels:
        for line in label[1:]:
            key, _, value = line.partition(": ")
            values[key].add(value)
    lines = [labels[0][0], f"{len(labels)} jobs"]
    return "\\n".join(lines + [f"{k}: {_values(v)}" for k, v in values.items()])


def fold(dot: str) -> str:
    """``dot`` (Snakemake's ``--dag`` output) with the jobs of one rule that wait for the
    same jobs of other rules drawn as one box (repeated until nothing more folds); the
    edges are those between the boxes' jobs."""
    head, labels, attrs, edges = [], {}, {}, set()
    for line in dot.splitlines():
        if m := NODE.match(line):
            labels[m[1]], attrs[m[1]] = m[2].split("\\n"), m[3]
        elif m := EDGE.match(line):
            edges.add((m[1], m[2]))
        elif line.strip() != "}":
            head.append(line)
    rule = {n: label[0] for n, label in labels.items()}
    members = {n: [n] for n in labels}
    while True:  # a folded box can make its dependants' upstream jobs equal
        ups = defaultdict(set)
        for a, b in edges:
            if rule[a] != rule[b]:
                ups[b].add(a)
        groups = defaultdict(list)
        for n in members:
            groups[rule[n], frozenset(ups[n])].append(n)
        into = {n: g[0] for g in groups.values() if len(g) > 1 for n in g[1:]}
        if not into:
            break
        for n, box in into.items():
            members[box] += members.pop(n)
        edges = {(into.get(a, a), into.get(b, b)) for a, b in edges}
    nodes = []
    for n, group in members.items():
        label = _label([labels[m] for m in group]) if len(group) > 1 else "\\n".join(labels[n])
        nodes.append(f'\t{n}[label = "{label}"{attrs[n]}];')
    order = sorted(edges, key=lambda e: (int(e[1]), int(e[0])))
    return "\n".join([*head, *nodes, *(f"\t{a} -> {b}" for a, b in order), "}"]) + "\n"
