"""Pipeline steps. Each module defines `add_arguments(parser)` (optional) and `run(config, args)`.

A step reads only the files earlier steps wrote (training/rundir/layout.py) and writes its own.
"""
