"""A campaign's plan: the checked experiment, its data, its Slurm jobs and the settings
that decide its weights."""
