"""Rule tokenize runs ``python -m hpcllm.text.tokenize_job`` from ``shell:`` (issue 51
item 11): its params reach the module intact through the shell, odd paths included."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from megatron.core.datasets.indexed_dataset import IndexedDataset
from support import REPO, run_snakemake

from hpcllm.job_arguments import MAX_ARGUMENT_CHARS, JobArgumentError, job_argument
from hpcllm.text.tokenization import load_tokenizer, with_special_handling

EOD = "<|endoftext|>"
# A space, quotes, a dollar sign and a backtick: what a shell would split or expand.
ODD = 'my texts/it\'s "$HOME" `x`'


def odd_workdir(tmp_path, tokenizer):
    """A working folder under an odd name whose source file and tokenizer have odd names,
    with a config of one local source (2 shards) and a given tokenizer."""
    work = tmp_path / "work dir 'quoted' $PATH"
    (work / "config").mkdir(parents=True)
    for name in ("resources", "profiles"):
        (work / name).symlink_to(REPO / name)
    for item in (REPO / "config").iterdir():
        if item.name != "config.yaml":
            (work / "config" / item.name).symlink_to(item)
    source = work / f"{ODD}.jsonl"
    source.parent.mkdir(parents=True)
    texts = [f'Document {i}: it\'s "quoted", $HOME and `ls`, {EOD} inside.' for i in range(9)]
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok_path = work / f"{ODD} tokenizer.json"
    shutil.copy(tokenizer, tok_path)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["text"] = {  # paths relative to the working directory
        "sources": {"web": {"type": "local", "files": f"{ODD}.jsonl", "shards": 2}},
        "tokenizers": {"tok": {"type": "files", "tokenizer_json": f"{ODD} tokenizer.json"}},
        "tokenize": {"tokenizers": ["tok"]},
    }
    (work / "config" / "config.yaml").write_text(json.dumps(config))
    return work, texts


def test_a_tokenize_job_from_shell_reads_odd_paths_and_writes_the_reference_ids(
    tmp_path, trained_tokenizer
):
    work, texts = odd_workdir(tmp_path, trained_tokenizer)
    run_snakemake(work, "--cores", "2", "data/tokenized/tok/web_text_document.bin", examples=False)
    tok = with_special_handling(load_tokenizer(trained_tokenizer), "text")
    eod = tok.token_to_id(EOD)
    ds = IndexedDataset(str(work / "data/tokenized/tok/web_text_document"))
    assert [d.tolist() for d in ds] == [tok.encode(t).ids + [eod] for t in texts]
    # each job's log holds its lines (logs.setup on the log named on the command line)
    for shard in ("0000", "0001"):
        log = (work / f"logs/tokenize/tok/web/{shard}.log").read_text()
        assert f"web shard {int(shard)}/2" in log, log


def test_the_module_names_a_bad_argument():
    proc = subprocess.run(
        [sys.executable, "-m", "hpcllm.text.tokenize_job", "--source-config", "[1]"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 2
    assert "--source-config: not a JSON object: '[1]'" in proc.stderr, proc.stderr


def test_a_config_too_large_for_a_command_line_is_refused_naming_its_key():
    files = [f"part-{i:06d}.jsonl" for i in range(MAX_ARGUMENT_CHARS // 10)]
    with pytest.raises(JobArgumentError, match=r"text.sources.web is [\d,]+ characters"):
        job_argument({"type": "local", "files": files}, "text.sources.web")
    config = {"b": 1, "a": ["it's", None]}
    argument = job_argument(config)
    assert f"{argument}" == str(argument) == '{"a":["it\'s",null],"b":1}'
    # Snakemake records a param by its repr to decide a rerun: the same as the plain dict's
    assert repr(argument) == repr(config) and argument == config
