"""Entry point: `python -m training <step> --config run.yaml [--set key=value ...]`."""

from training.cli import main

raise SystemExit(main())
