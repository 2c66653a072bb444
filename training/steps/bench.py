"""bench: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step bench is not implemented yet")
