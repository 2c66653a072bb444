"""Benchmarks of the data path, from files to batches: loader.py (`bench loader`: scDINO's style of
loading against the packed, batched loader) and dali.py (its DALI row), scale.py (`bench scale`: what
opening a dataset costs as it grows), table_checks.py (what the per-cell table's checks cost) and
ingest_rate.py (`bench ingest`: crops cut per core-second out of fields of view)."""
