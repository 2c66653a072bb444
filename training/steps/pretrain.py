"""pretrain: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step pretrain is not implemented yet")
