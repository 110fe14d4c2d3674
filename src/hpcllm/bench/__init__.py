"""Benchmark sweeps: expansion from experiment configs, runs, log parsing, metrics, plots."""
