"""The test suite as one package: a test module is named by its path (tests.training.recovery.test_spot), so
two folders may hold test files of the same name; helpers that tests share live in tests.support."""
