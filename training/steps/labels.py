"""labels: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step labels is not implemented yet")
