"""Exit statuses of a training process: the contract with the launcher (slurm/heal.sh).

torchrun restarts a worker group after any non-zero status (up to --max-restarts), so within one
job every failure is retried; the batch script decides what happens after the launch ends, from the
status where it sees one (srun without torchrun) and from the failure marker where it does not.
"""

OK = 0
"""Finished, or pre-empted: then the PREEMPTED marker asks the batch script for a requeue."""
DETERMINISTIC = 2
"""Bad config, missing data, a diverged loss, a collapse under train.stop_on_collapse: the same
again would fail the same way. Not retried; training leaves the failure marker. (The CLI's status
for every UserError.)"""
HANG = 76
"""The progress watchdog ended a rank that completed no step within train.hang_timeout_minutes.
Retried, like every status other than OK and DETERMINISTIC (signals, CUDA/NCCL errors, OOM)."""
