#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth` / `npx cdk deploy --all` (cdk.json runs this file).

The only place that reads CDK context. Settings come from cdk.json's `scdino` context object, an
optional YAML file (`-c settings=my.yaml`) and single keys (`-c cluster.max_nodes=4`); a wrong
value stops synth with one line naming the setting. The stacks are account-agnostic unless
`account` is set (the CLI deploys to its credentials' account), so synth needs no AWS lookup.
"""

from __future__ import annotations

import sys

import aws_cdk as cdk

from stacks.app_builder import build_app
from stacks.shared.settings import Settings, SettingsError, settings_from


def settings_from_context(app: cdk.App) -> Settings:
    """Merge defaults (cdk.json), the settings file and `-c key=value` overrides, in that order."""
    return settings_from(app.node.try_get_context)


def main() -> int:
    app = cdk.App()
    try:
        settings = settings_from_context(app)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    build_app(app, settings)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
