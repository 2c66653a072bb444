"""report: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step report is not implemented yet")
