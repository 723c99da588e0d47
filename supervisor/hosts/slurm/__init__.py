"""A Slurm cluster as a host."""
