"""Self-healing training: what lets a run survive a lost rank, node or Spot instance by itself.

- exit_codes.py  the exit statuses a training process ends with, and what the batch script does
- watchdog.py    a rank that stops progressing (stuck collective, dead peer) ends its process
- failures.py    deterministic failures (not retried) versus transient ones (retried), recorded
- spot.py        the EC2 Spot interruption notice (IMDSv2) turned into the pre-emption protocol

slurm/heal.sh is the launcher's half: torchrun's in-job restarts, the requeue, the summary lines.
"""
