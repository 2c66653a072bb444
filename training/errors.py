"""Errors a user can fix. The CLI prints their message on one line and exits with status 2."""


class UserError(Exception):
    """Bad input or a missing prerequisite; the message says what is wrong and how to fix it."""


class MissingInputError(UserError):
    """A step's input is absent; the message names the step that produces it."""

    def __init__(self, what: str, path: object, step: str) -> None:
        super().__init__(f"{what} not found at {path}: run `python -m training {step}` first")

    def __reduce__(self):
        # Picklable (e.g. sent between ranks or out of a DataLoader worker) as its message.
        return UserError, (str(self),)


class DamagedFileError(UserError):
    """A file an earlier step wrote is there but unusable as it stands (truncated, unparsable, of the
    wrong size, failing its checksum); the message names it, what is wrong and what writes it again."""

    def __init__(self, path: object, problem: str, remedy: str) -> None:
        super().__init__(f"{path} {problem}: {remedy}")
        self.path, self.problem, self.remedy = path, problem, remedy

    def __reduce__(self):
        return UserError, (str(self),)
