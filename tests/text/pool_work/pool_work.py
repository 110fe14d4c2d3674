"""A shard's work for tests/text/test_shard_pool.py: writes its two files, or kills its
own process (SIGKILL, as the kernel's OOM killer would) when told to."""

import os
import signal
from pathlib import Path


def work(prefix: str, kill: bool = False) -> dict:
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    for ext in (".bin", ".idx"):
        Path(prefix + ext).write_bytes(b"done")
    return {}
