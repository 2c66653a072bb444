"""Files on disk: every write atomic (atomic.py: temporary name beside the target, then rename) and the
free space a write needs (diskspace.py: checked before a step writes much, named when a write runs out)."""
