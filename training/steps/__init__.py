"""The commands of `python -m training <name>`: one module each (training/cli.py's STEPS maps the name).

Each module defines `add_arguments(parser)` (optional: its own flags) and `run(config, layout, args)`,
which returns the exit status: `config` the loaded configuration, `layout` its run's RunLayout,
`args` the parsed command line. A module that reads its own configuration, so that a bad one is its
own one-line error (`READS_ITS_OWN_CONFIG = True`: `chain`), defines `run(args)` instead. A module's
docstring opens with the line `--help` shows and gives the exact command that runs it.

A pipeline step reads only the files earlier steps wrote (training/rundir/layout.py) and writes its
own; the commands that are not steps (training/cli.py's UTILITIES) write no config.yaml and no timing.
"""
