"""Helpers the tests share (tiny configs, fakes, runs built once, the local Slurm cluster, synthesis):
imported as tests.support.<module>, never collected as tests."""
