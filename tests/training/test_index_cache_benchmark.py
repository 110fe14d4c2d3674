"""benchmarks/index_cache.py runs on tiny data, so it does not rot."""

from __future__ import annotations

import importlib.util

from support import REPO


def test_index_cache_benchmark_on_a_tiny_dataset(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("index_cache", REPO / "benchmarks/index_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--gb", "0.004", "--seq", "128", "--dir", str(tmp_path / "bench")])
    # the point of the cache: the start that reads it builds no index, the other one does
    assert result["built_with_cache"] is False
    assert result["built_without_cache"] is True
    assert result["with_cache_s"] > 0 and result["without_cache_s"] > 0
    out = capsys.readouterr().out
    assert "index cache (the CPU job):" in out and "start-up saved by the cache:" in out
