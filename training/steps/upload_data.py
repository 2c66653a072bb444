"""upload_data: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step upload_data is not implemented yet")
