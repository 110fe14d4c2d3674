"""The text stages through Snakemake on the built-in configuration."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from megatron.core.datasets.indexed_dataset import IndexedDataset
from support import REPO, hang_guard, make_workdir, run_snakemake

from hpcllm.configuration import config_reference
from hpcllm.text.tokenization import load_tokenizer, with_special_handling

SOURCES = ("sample_en", "sample_multilingual", "fineweb")
TARGETS = [
    f"data/tokenized/sample_bpe/{s}_text_document.{e}" for s in SOURCES for e in ("bin", "idx")
]

pytestmark = pytest.mark.workflow


CONFIG = yaml.safe_load((REPO / "config" / "examples" / "local.yaml").read_text())["text"]


def jsonl_zst_records(path) -> list[dict]:
    """The records of a JSONL.zst file, read with zstandard and json alone (independent of
    the package's readers)."""
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        data = r.read()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def reference_texts(name: str) -> list[str]:
    """What the merged dataset of a built-in source must hold, computed from the inputs
    without the workflow's sharding: local sources are every document of the file in
    order; the FineWeb mirror is each parquet file's first max_documents/N non-empty texts
    (one file per shard)."""
    cfg = CONFIG["sources"][name]
    if cfg["type"] == "local":
        texts = [r["text"] for r in jsonl_zst_records(REPO / cfg["files"])]
        return [t for t in texts if t.strip()]
    files = sorted((REPO / cfg["mirror"] / "sample" / "10BT").glob("*.parquet"))
    assert len(files) == cfg["shards"] == 2
    per_file = cfg["max_documents"] // len(files)
    out = []
    for f in files:
        out += [
            t for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t.strip()
        ][:per_file]
    return out


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    work = make_workdir(tmp_path_factory.mktemp("text") / "work")
    run_snakemake(work, "--cores", "2", *TARGETS)
    return work


def test_merged_datasets_hold_the_reference_ids_in_source_order(text_run):
    tok = load_tokenizer(text_run / "data/tokenizers/sample_bpe/tokenizer.json")
    text_tok = with_special_handling(tok, "text")
    eod = tok.token_to_id("<|endoftext|>")
    for name in SOURCES:
        texts = reference_texts(name)
        ds = IndexedDataset(str(text_run / f"data/tokenized/sample_bpe/{name}_text_document"))
        assert len(ds) == len(texts) > 0, name
        for doc, text in zip(ds, texts, strict=True):
            assert doc.tolist() == text_tok.encode(text, add_special_tokens=False).ids + [eod]


def test_every_shard_manifest_counts_what_it_wrote(text_run):
    """The manifest per tokenized shard counts the documents its .idx holds, and the
    source is read in place: no re-encoded copy, no login-node step for these sources."""
    for name in SOURCES:
        prefixes = sorted(
            p.with_suffix("")
            for p in (text_run / f"data/tokenized/sample_bpe/{name}").glob("*_text_document.idx")
        )
        assert len(prefixes) == CONFIG["sources"][name]["shards"]
        for prefix in prefixes:
            ds = IndexedDataset(str(prefix))
            manifest = json.loads(prefix.with_name(prefix.name + ".manifest.json").read_text())
            assert manifest["documents"] == len(ds) > 0, prefix
            assert manifest["source"] == name and manifest["skipped_total"] == 0
    assert not (text_run / "data/raw").exists()
    assert not (text_run / "data/hub").exists()
    assert not list(text_run.glob("data/**/*.jsonl.zst"))


def test_rerun_gives_byte_identical_outputs(text_run):
    before = {t: (text_run / t).read_bytes() for t in TARGETS}
    run_snakemake(text_run, "--cores", "2", "--forceall", *TARGETS)
    assert {t: (text_run / t).read_bytes() for t in TARGETS} == before


def planned_jobs(stdout: str) -> dict[str, int]:
    """The job counts of a dry run ("Job stats:" table: job, count)."""
    table = stdout.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_dry_run_lists_every_text_job(workdir):
    proc = run_snakemake(workdir, "-n", "--cores", "2", *TARGETS)
    shards = sum(CONFIG["sources"][s]["shards"] for s in SOURCES)
    assert planned_jobs(proc.stdout) == {
        "train_tokenizer": 1,
        "tokenize": shards,
        "merge_tokenized": len(SOURCES),
        "total": shards + 1 + len(SOURCES),
    }


def test_adding_a_source_plans_only_that_sources_jobs(text_run):
    # The tokenizer's training sources are pinned (without `sources` it trains on all of
    # them, so a new source is new training data and retrains it).
    (text_run / "extra.jsonl").write_text('{"text": "one more source"}\n' * 3)
    (text_run / "extra.yaml").write_text(
        "text:\n  sources:\n    extra:\n      type: local\n      files: extra.jsonl\n"
        "      shards: 3\n  tokenizers:\n    sample_bpe:\n"
        f"      sources: [{', '.join(SOURCES)}]\n"
    )
    targets = [
        *TARGETS,
        *(f"data/tokenized/sample_bpe/extra_text_document.{e}" for e in ("bin", "idx")),
    ]
    proc = run_snakemake(text_run, "-n", *targets, "--configfile", "extra.yaml")
    assert planned_jobs(proc.stdout) == {
        "tokenize": 3,
        "merge_tokenized": 1,
        "total": 4,
    }, proc.stdout


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        (
            "text:\n  on_bad_record: maybe\n",
            "config key text.on_bad_record: 'maybe' is not one of ['fail', 'skip']",
        ),
        (
            "text:\n  sources:\n    bad:\n      type: local\n",
            "config key text.sources.bad: 'files' is a required property",
        ),
        ("text:\n  tokenize:\n    tokenizers: [nope]\n", "text.tokenize.tokenizers names 'nope'"),
        (
            "text:\n  sources:\n    gone:\n      type: local\n      files: missing/*.jsonl\n",
            "text.sources.gone.files: 'missing/*.jsonl' matches no file",
        ),
        ("visoin: {}\n", "('visoin' was unexpected)"),
    ],
)
def test_config_errors_name_the_key_at_plan_time(workdir, yaml_text, message):
    (workdir / "bad.yaml").write_text(yaml_text)
    proc = run_snakemake(workdir, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_config_readme_is_in_step_with_the_schemas():
    assert (REPO / "config" / "README.md").read_text() == config_reference(
        REPO / "workflow" / "schemas"
    ), "config/README.md is out of date: run `python -m hpcllm config-docs`"


def test_training_on_a_files_tokenizer_uses_exactly_its_files(workdir):
    (workdir / "tok").mkdir()
    (workdir / "tok/vocab.json").write_text('{"<|endoftext|>": 0, "a": 1}')
    (workdir / "tok/merges.txt").write_text("#version: 0.2\n")
    (workdir / "given.yaml").write_text(
        "text:\n  tokenizers:\n    given:\n      type: files\n      vocab_file: tok/vocab.json\n"
        "      merges_file: tok/merges.txt\n  tokenize:\n    tokenizers: [sample_bpe, given]\n"
        "training:\n  run: [tiny_given]\n  experiments:\n    tiny_given:\n      engine: torch\n"
        "      preset: tiny\n      data:\n        tokenizer: given\n"
        "        sources: {sample_en: 1.0}\n        split: '98,2,0'\n"
        "      layout: {nodes: 1, procs_per_node: 1}\n      segments: 1\n"
        "      iterations_per_segment: 3\n"
    )
    proc = run_snakemake(
        workdir, "-n", "results/train/tiny_given/seg1.json", "--configfile", "given.yaml"
    )
    jobs = planned_jobs(proc.stdout)
    assert "train_tokenizer" not in jobs and jobs["train_segment"] == 1, proc.stdout
    # the engines read the tokenizer_folder made of exactly those files (Megatron:
    # HuggingFaceTokenizer on the folder, never a gpt2 from the hub)
    assert jobs["tokenizer_folder"] == 1, proc.stdout
    folder = proc.stdout.split("rule tokenizer_folder:", 1)[1].split("\n\n", 1)[0]
    assert "input: tok/vocab.json, tok/merges.txt" in folder, folder
    segment = proc.stdout.split("rule train_segment:", 1)[1].split("\n\n", 1)[0]
    assert "data/tokenizers/given/hf/tokenizer.json" in segment, segment
    assert "data/tokenizers/sample_bpe" not in proc.stdout


def test_config_docs_cli_writes_the_reference_of_the_schemas_it_is_given(tmp_path):
    import shutil
    import subprocess
    import sys

    out = tmp_path / "README.md"
    cmd = [sys.executable, "-m", "hpcllm", "config-docs", "--output", str(out)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    assert out.read_text() == (REPO / "config" / "README.md").read_text()
    # Another schema folder: a new key and its description appear in what it writes.
    schemas = shutil.copytree(REPO / "workflow" / "schemas", tmp_path / "schemas")
    text = (schemas / "text.schema.yaml").read_text()
    new_key = "  zz_new_key:\n    type: integer\n    description: A key added by the test.\n"
    (schemas / "text.schema.yaml").write_text(
        text.replace("properties:\n", "properties:\n" + new_key, 1)
    )
    subprocess.run([*cmd, "--schemas", str(schemas)], cwd=tmp_path, check=True)
    written = out.read_text()
    assert "zz_new_key" in written and "A key added by the test." in written
    assert written == config_reference(schemas)


GPU_ONLY_SITES = ("juwels", "jupiter", "leonardo")


def test_gpu_only_sites_tokenize_a_node_of_shards_per_job_without_job_groups():
    """A Snakemake group job runs its jobs one at a time inside the Slurm job (the job
    step's Snakemake gets --jobs 1 from plugin 2.8.0), so GPU-only sites use no groups: one
    tokenize_batch job per node's worth of shards (auto: cores / the tokenize threads)."""
    for site in GPU_ONLY_SITES:
        cluster = yaml.safe_load((REPO / f"config/clusters/{site}.yaml").read_text())
        profile = yaml.safe_load((REPO / f"profiles/{site}/config.yaml").read_text())
        assert cluster["partitions"]["cpu"] is None
        assert "groups" not in profile and "group-components" not in profile, site
        partition = profile["set-resources"]["tokenize"]["slurm_partition"]
        assert profile["set-resources"]["tokenize_batch"]["slurm_partition"] == partition


def test_a_juwels_plan_tokenizes_twelve_shards_per_slurm_job(workdir):
    (workdir / "many.yaml").write_text("text:\n  sources:\n    sample_en:\n      shards: 30\n")
    env = {"HPCLLM_ACCOUNT": "proj0042"}
    proc = run_snakemake(
        workdir,
        "-n",
        "--profile",
        "profiles/juwels",
        *TARGETS,
        "--configfile",
        "many.yaml",
        env=env,
        timeout=hang_guard(15),  # a dry run: ~15 s quiet
    )
    threads = int(
        (REPO / "workflow/rules/text_functions.smk")
        .read_text()
        .split("TOKENIZE_THREADS = ")[1]
        .split()[0]
    )
    cores = yaml.safe_load((REPO / "config/clusters/juwels.yaml").read_text())["cpus_per_node"]
    per_job = cores // threads
    assert per_job == 12
    jobs = proc.stdout.split("rule tokenize_batch:")[1:]
    # 30 + 2 + 2 shards in batches of at most 12 (the batches read the sources' files in
    # place: 3 batches of sample_en, one of each other source); no one-shard jobs.
    batches = sorted(j.split("wildcards: ")[1].split("\n")[0] for j in jobs)
    assert batches == sorted(
        [f"tok=sample_bpe, source=sample_en, batch={b:04d}" for b in range(3)]
        + [f"tok=sample_bpe, source={s}, batch=0000" for s in ("sample_multilingual", "fineweb")]
    ), batches
    assert "rule tokenize:" not in proc.stdout and "Group job" not in proc.stdout
    # The merge waits for the batches of its source.
    merge = proc.stdout.split("rule merge_tokenized:")[1:]
    assert any(m.split("input: ")[1].split("\n")[0].count("batch") == 3 for m in merge)


def planned_threads(stdout: str, rule: str) -> list[int]:
    """Every planned job's threads (Snakemake prints none for 1)."""
    jobs = [j.split("\n[")[0] for j in stdout.split(f"rule {rule}:")[1:]]
    return [int(j.split("threads: ")[1].split()[0]) if "threads: " in j else 1 for j in jobs]


def test_shards_share_this_machines_cores(workdir):
    """Run here with fewer cores than the shards' threads, the shards share the cores (and
    run side by side), at most 4 each (on a cluster each gets 4: tests/slurm/
    test_end_to_end.py)."""
    (workdir / "four.yaml").write_text("text:\n  sources:\n    sample_en:\n      shards: 4\n")
    target = [t for t in TARGETS if "/sample_en_" in t]
    for cores, want in (("2", 1), ("8", 2), ("64", 4)):
        proc = run_snakemake(workdir, "-n", "--cores", cores, *target, "--configfile", "four.yaml")
        assert planned_threads(proc.stdout, "tokenize") == [want] * 4, (cores, proc.stdout)


def test_a_tokenizer_trains_on_its_sources_only(workdir):
    (workdir / "only.yaml").write_text(
        "text:\n  tokenizers:\n    sample_bpe:\n      sources: [sample_multilingual]\n"
    )
    proc = run_snakemake(workdir, "-n", *TARGETS, "--configfile", "only.yaml")
    block = proc.stdout.split("rule train_tokenizer:", 1)[1].split("output:", 1)[0]
    assert block.count("resources/sample_text/multilingual.jsonl.zst") == 1, block
    assert "sample_en" not in block and "fineweb" not in block


def test_a_tokenizer_json_only_tokenizer_is_planned_for_training_or_refused_by_its_key(
    workdir,
):
    """A given tokenizer.json alone plans training (its engine folder from
    tokenizer_folder); one that cannot be loaded, or lacks the end-of-document token, is
    refused at plan time naming the key and what to set."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    (workdir / "json.yaml").write_text(
        "text:\n  tokenizers:\n    given:\n      type: files\n      tokenizer_json: tok.json\n"
        "  tokenize:\n    tokenizers: [sample_bpe, given]\n"
        "training:\n  run: [tiny_given]\n  experiments:\n    tiny_given:\n      engine: torch\n"
        "      preset: tiny\n      data:\n        tokenizer: given\n"
        "        sources: {sample_en: 1.0}\n        split: '98,2,0'\n"
        "      layout: {nodes: 1, procs_per_node: 1}\n      segments: 1\n"
        "      iterations_per_segment: 3\n"
    )

    def plan():
        return run_snakemake(
            workdir,
            "-n",
            "results/train/tiny_given/seg1.json",
            "--configfile",
            "json.yaml",
            check=False,
        )

    (workdir / "tok.json").write_text("{}")
    proc = plan()
    assert proc.returncode != 0
    assert "text.tokenizers.given.tokenizer_json: tok.json: not a loadable tokenizer.json" in (
        proc.stdout + proc.stderr
    )
    words = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(workdir / "tok.json"))
    proc = plan()
    assert proc.returncode != 0
    assert (
        "text.tokenizers.given: the end-of-document token eod_token '<|endoftext|>' is not in "
        "tok.json (WordLevel, special tokens: none); set text.tokenizers.given.eod_token"
    ) in proc.stdout + proc.stderr
    words.add_special_tokens(["<|endoftext|>"])
    words.save(str(workdir / "tok.json"))
    proc = plan()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for job in ("tokenizer_folder", "prepare_data_cache", "train_segment"):
        assert f"rule {job}:" in proc.stdout, proc.stdout
    assert "data/tokenizers/given/hf/tokenizer_config.json" in proc.stdout


def test_only_a_hub_source_without_a_mirror_has_a_login_node_step(workdir):
    """One fetch_text per such source (on the login node), which the tokenize jobs read
    from; the built-in sources (local files, the shipped mirror) have none."""
    (workdir / "hub.yaml").write_text(
        "text:\n  sources:\n    web:\n      type: hub\n      dataset: org/web-text\n"
        "      shards: 3\n  tokenizers:\n    sample_bpe:\n"
        f"      sources: [{', '.join(SOURCES)}]\n"
    )
    web = [f"data/tokenized/sample_bpe/web_text_document.{e}" for e in ("bin", "idx")]
    proc = run_snakemake(workdir, "-n", *TARGETS, *web, "--configfile", "hub.yaml")
    shards = sum(CONFIG["sources"][s]["shards"] for s in SOURCES)
    jobs = planned_jobs(proc.stdout)
    assert jobs["fetch_text"] == 1 and jobs["tokenize"] == shards + 3, proc.stdout
    fetch = proc.stdout.split("rule fetch_text:", 1)[1].split("[", 1)[0]
    assert "output: data/hub/web/fetched.json" in fetch and "wildcards: source=web" in fetch
    proc = run_snakemake(workdir, "-n", *TARGETS)
    assert "fetch_text" not in proc.stdout


def test_a_hub_mirror_that_is_not_there_stops_the_plan(workdir):
    (workdir / "gone.yaml").write_text(
        "text:\n  sources:\n    web:\n      type: hub\n      dataset: org/web-text\n"
        "      mirror: nowhere/web\n      shards: 1\n"
    )
    target = "data/tokenized/sample_bpe/web_text_document.bin"
    proc = run_snakemake(workdir, "-n", target, "--configfile", "gone.yaml", check=False)
    assert proc.returncode != 0
    assert "the hub mirror nowhere/web of org/web-text does not exist" in proc.stdout + proc.stderr
