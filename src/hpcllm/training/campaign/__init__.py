"""Running a campaign: its segments, their attempts, the Slurm chain, status and restart."""
