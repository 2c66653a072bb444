"""The multi-process layer: groups.py (process groups, ranks, collectives) and parallel.py (the one place
that applies DDP, FSDP2 and torch.compile). Model code never imports it."""
