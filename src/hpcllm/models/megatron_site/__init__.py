"""The folder that hpcllm.models.megatron_compat.run_script puts first on the
``PYTHONPATH`` of a bare-metal Megatron job: its ``sitecustomize`` applies the Python 3.11
shim in every Python process the job starts, not only the first."""
