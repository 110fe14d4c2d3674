"""Make module_purpose.jsonl from the shipped sample corpus (resources/sample_text/en.jsonl.zst).

Each item: a Python module's name and four one-line descriptions taken from the NAME
sections of the corpus's pydoc pages, the module's own among them. Deterministic (a seeded
shuffle); rerun from the checkout's root after the corpus changes:
    .venv/bin/python resources/eval_tasks/make_module_purpose.py
"""

import io
import json
import random
import re
from pathlib import Path

import zstandard

HERE = Path(__file__).parent
CORPUS = HERE.parent / "sample_text" / "en.jsonl.zst"

with CORPUS.open("rb") as f:
    lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f)).readlines()
pairs = []
for line in lines:
    match = re.search(r"^NAME\n\s+(\S+) - (.+)$", json.loads(line)["text"], re.M)
    if match:
        name, purpose = match.groups()
        pairs.append((name, " ".join(purpose.split())))
rng = random.Random(0)
with (HERE / "module_purpose.jsonl").open("w") as out:
    for name, purpose in pairs:
        others = rng.sample([p for n, p in pairs if n != name], 3)
        choices = [purpose, *others]
        rng.shuffle(choices)
        item = {"module": name, "choices": choices, "label": choices.index(purpose)}
        out.write(json.dumps(item) + "\n")
print(f"{len(pairs)} items")
