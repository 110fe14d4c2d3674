"""Stand-in: Megatron-LM in the rehearsal image (tests/slurm/standins/apptainer)."""
