"""Why things failed, for training, the benchmarks and the terminal.

- ``classify``: a run's failure class (a training segment, a benchmark point) from its
  log and Slurm's state, and whether another attempt can get past it.
- ``summary``: after a failed workflow run, each failed job's reason line from its log,
  and the workflow-level fix where there is one (the Snakefile's ``onerror``).
"""
