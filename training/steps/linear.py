"""linear: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step linear is not implemented yet")
