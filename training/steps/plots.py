"""plots: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step plots is not implemented yet")
