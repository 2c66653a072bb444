"""The pipeline's job graph, computed once from the configuration, the options and the site settings:
graph.py (which jobs, their arguments, resources and dependencies, as plain data) and sbatch.py (a job
as an `sbatch` command line, and the #SBATCH defaults of a script). slurm/submit_pipeline.sh submits
the graph with sbatch on the cluster; a REST client submits the same graph through slurmrestd."""

from training.chain.graph import PROFILE_STEPS, STEPS, Chain, ChainOptions, JobSpec, Site, plan, plan_chain

__all__ = ["PROFILE_STEPS", "STEPS", "Chain", "ChainOptions", "JobSpec", "Site", "plan", "plan_chain"]
