# Placeholder: the benchmarks stage is added by its own issue.


def benchmark_targets():
    return []
