"""The help people read: `hpcllm --help` and the benchmark scripts' options."""

from __future__ import annotations

import argparse
import ast
import re

import pytest
from support import REPO

from hpcllm import cli

# reStructuredText markup that argparse prints as it is.
RST = re.compile(r"``|:(?:func|class|mod|meth|attr):`")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def hpcllm_parser(monkeypatch) -> argparse.ArgumentParser:
    """The parser cli.main builds (caught as it parses)."""
    caught = {}
    real = argparse.ArgumentParser.parse_args

    def catch(self, *args, **kwargs):
        caught.setdefault("parser", self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(SystemExit):
        cli.main(["status"])
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
    return caught["parser"]


def test_hpcllm_help_is_plain_text_and_every_option_says_what_it_does(monkeypatch, capsys):
    parser = hpcllm_parser(monkeypatch)
    parsers = {"hpcllm": parser, **subparsers(parser)}
    assert set(parsers) == {
        "hpcllm",
        "sample-corpus",
        "config-docs",
        "inspect",
        "status",
        "restart-training",
        "cancel-training",
        "retry-training",
        "accept-checkpoint",
        "gpu-check",
        "dag",
    }
    from hpcllm import gpu_check

    parsers["gpu-check"] = gpu_check.parser()  # its own options (hpcllm gpu-check -h)
    for name, p in parsers.items():
        text = p.format_help()
        assert not RST.search(text), f"{name} --help shows markup:\n{text}"
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, (
                f"{name}: {'/'.join(action.option_strings) or action.dest} has no help"
            )


@pytest.mark.parametrize("script", sorted((REPO / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_every_benchmark_option_has_help(script):
    source = script.read_text()
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    ]
    assert calls, f"{script.name} has no options (was it rewritten without argparse?)"
    lacking = [
        ast.get_source_segment(source, c)
        for c in calls
        if not any(k.arg == "help" for k in c.keywords)
    ]
    assert not lacking, f"{script.name}: options without help=: {lacking}"
