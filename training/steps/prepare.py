"""prepare: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step prepare is not implemented yet")
