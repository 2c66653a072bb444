"""features: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step features is not implemented yet")
