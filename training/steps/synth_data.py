"""synth_data: not implemented yet."""

from training.errors import UserError


def run(config, args):
    raise UserError("step synth_data is not implemented yet")
