"""knn: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step knn is not implemented yet")
