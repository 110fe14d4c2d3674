"""Command-line traps of Snakemake's config options, caught before the config is checked.

- ``--configfile`` takes every word up to the next option, so a target written after it
  is read as a config file (``snakemake --configfile my.yaml results/x.json``);
- a second ``--configfile`` replaces the first (argparse keeps the last list);
- a YAML syntax error in the built-in config file is reported by Snakemake without file or
  line (a ``--configfile``'s is too, but Snakemake reads those before the Snakefile);
- a key given twice in one mapping of a config file: YAML loaders keep the last value
  without a word (Snakemake's included), so the first one is silently lost;
- a target naming an experiment the config does not define (a typo) gets Snakemake's
  "No rule to produce": the workflow lists the experiments it knows.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

# Folders the workflow writes its outputs to: a file there is a target, not a config.
OUTPUT_FOLDERS = ("data", "results", "logs", "checkpoints", "containers", "plots")
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")


def _shown(path: Path, workdir: Path) -> str:
    try:
        return os.path.relpath(path, workdir) if path.is_absolute() else str(path)
    except ValueError:
        return str(path)


def target_like_configfiles(
    configfiles: Iterable[str | os.PathLike], workdir: str | os.PathLike
) -> list[str]:
    """A warning for each config file that looks like a target of the workflow."""
    workdir = Path(workdir).absolute()
    warnings = []
    for raw in configfiles:
        path = Path(raw)
        shown = _shown(path if path.is_absolute() else workdir / path, workdir)
        parts = Path(shown).parts
        if parts and parts[0] in OUTPUT_FOLDERS:
            why = f"it is under {parts[0]}/, where the workflow writes its outputs"
        elif path.suffix.lower() not in CONFIG_SUFFIXES:
            why = f"its name does not end in {', '.join(CONFIG_SUFFIXES)}"
        else:
            continue
        warnings.append(
            f"--configfile {shown}: this looks like a target, not a config file ({why}). "
            "Every word after --configfile up to the next option is read as a config file: "
            f"name targets first (snakemake {shown} --configfile my.yaml) or end the list "
            "with -- (snakemake --configfile my.yaml -- " + shown + ")"
        )
    return warnings


def repeated_configfile(argv: Sequence[str]) -> str | None:
    """A warning when ``--configfile`` is given more than once (only the last one counts)."""
    groups: list[list[str]] = []
    words = iter(argv[1:])
    current: list[str] | None = None
    for word in words:
        option, eq, value = word.partition("=")
        if option in _CONFIGFILE_OPTIONS:
            current = [value] if eq else []
            groups.append(current)
        elif word.startswith("-"):
            current = None
        elif current is not None:
            current.append(word)
    if len(groups) < 2:
        return None
    dropped = [f for group in groups[:-1] for f in group]
    every = [f for group in groups for f in group]
    return (
        f"--configfile is given {len(groups)} times: Snakemake reads only the last one's "
        f"files ({' '.join(groups[-1]) or 'none'}) and ignores {' '.join(dropped) or 'the others'}. "
        f"Give every file after one --configfile: --configfile {' '.join(every)}"
    )


def yaml_syntax_error(path: str | os.PathLike) -> str | None:
    """``file:line:column: problem`` for a YAML file that does not parse, else None."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            yaml.safe_load(f)
    except OSError:
        return None  # Snakemake says the file is missing
    except yaml.MarkedYAMLError as e:
        # Where the construct that is not closed began (e.g. a "[" without "]"), else
        # where the parser stopped; the latter is added when both are known.
        mark = e.context_mark or e.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join(p for p in (e.context, e.problem) if p)
        found = ""
        if e.context_mark and e.problem_mark:
            found = (
                f" (found at line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1})"
            )
        return f"{where}: YAML syntax error: {problem}{found}"
    except yaml.YAMLError as e:
        return f"{path}: YAML syntax error: {e}"
    return None


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a message shows it: relative to the working directory where it is
    inside it (Snakemake makes the --configfile paths absolute), else as it is, without
    ``..`` steps (a profile's path: .../profiles/local/../../config/examples/local.yaml)."""
    relative = os.path.relpath(os.path.abspath(path))
    outside = relative == os.pardir or relative.startswith(os.pardir + os.sep)
    return os.path.normpath(path) if outside else relative


def duplicate_keys(path: str | os.PathLike) -> list[str]:
    """``file:line: key a.b.c is given twice ...`` for each key repeated within one mapping
    of the YAML (or JSON) file ``path``; [] when there is none or it does not parse (its
    syntax error is reported elsewhere)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            root = yaml.compose(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return []
    problems: list[str] = []
    shown = shown_path(path)
    seen_nodes: set[int] = set()  # an alias points at a node already walked

    def walk(node, keys: list[str]) -> None:
        if id(node) in seen_nodes:
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults`: keys given beside it override it, by design
                name = [*keys, key_node.value]
                line = key_node.start_mark.line + 1
                # The resolved tag with the text: `1` and `"1"` are different keys.
                ident = (key_node.tag, key_node.value)
                if ident in first:
                    problems.append(
                        f"{shown}:{line}: key {'.'.join(name)} is given twice in this file "
                        f"(first at line {first[ident]}); YAML keeps only the last value, "
                        "silently. Remove one of them (or merge what each one sets)."
                    )
                else:
                    first[ident] = line
                walk(value_node, name)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, [*keys[:-1], f"{keys[-1]}[{i}]"] if keys else [f"[{i}]"])

    if root is not None:
        walk(root, [])
    return problems


def read_config_files(paths: Iterable[str | os.PathLike]) -> list[tuple[str, object]]:
    """(path, content) of each config file that exists and parses, in the order given (for
    the messages that name the file a key came from)."""
    import yaml

    files = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            files.append((shown_path(path), data))
        except (OSError, yaml.YAMLError):
            continue
    return files


# The targets that name an experiment: the folder before it, and what may follow it.
_EXPERIMENT_TARGETS = re.compile(
    r"^(?:\./)?(?P<where>results/(?:train|export|eval)/|checkpoints/|results/layout/"
    r"|data/(?:eval_tasks|index_cache)/|logs/train_segment/)(?P<name>[^/]+?)(?:\.json)?(?:/.*)?$"
)


def unknown_experiment_targets(
    targets: Iterable[str], experiments: Iterable[str], rules: Iterable[str]
) -> str | None:
    """A message for targets that name an experiment the config does not define (a
    typo: Snakemake itself says only "No rule to produce ..."), listing the ones it
    defines and the closest; also for an experiment's bare name given as a target."""
    known, rule_names = sorted(experiments), set(rules)
    problems = []
    for target in targets:
        m = _EXPERIMENT_TARGETS.match(str(target))
        if m:
            name = m["name"]
        elif "/" not in str(target) and str(target) not in rule_names:
            name = str(target)
            if name in known:
                problems.append(
                    f"target {target}: an experiment's name is not a target; its files are, "
                    f"e.g. results/train/{name}/seg1.json (a segment), "
                    f"results/train/{name}/loss.png (its loss curve), or the default target"
                )
                continue
            if not difflib.get_close_matches(name, known, n=1, cutoff=0.75):
                continue  # not an experiment's name: Snakemake's own message stands
        else:
            continue
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        problems.append(
            f"target {target}: no experiment {name!r} in the config"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + "; the config defines "
            + (", ".join(known) if known else "none (training.experiments is empty)")
        )
    return "\n".join(problems) or None


def requested_targets(argv: Sequence[str]) -> list[str]:
    """The targets of a ``snakemake`` command line, read with Snakemake's own argument
    parser (so ``--configfile a.yaml b`` takes ``b`` as Snakemake does); none where the
    process is not the snakemake command or its line does not parse."""
    if not argv or "snakemake" not in Path(argv[0]).as_posix():
        return []
    from snakemake.cli import get_argument_parser

    try:
        args = get_argument_parser().parse_args(list(argv[1:]))
    except (SystemExit, Exception):  # Snakemake reports a bad command line itself
        return []
    return [str(t) for t in getattr(args, "targets", None) or []]
