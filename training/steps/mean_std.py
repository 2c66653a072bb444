"""mean_std: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step mean_std is not implemented yet")
