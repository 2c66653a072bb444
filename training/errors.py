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
        # sent between processes as itself (a DataLoader worker's, training/data/loading/torch_loader.py)
        return DamagedFileError, (self.path, self.problem, self.remedy)


class PathTakenError(UserError):
    """A run file cannot be written where something else stands in its place: a folder where the file
    belongs, or a file where its folder does. Writers replace files by renaming and delete nothing
    they did not write, so the user moves it away; the CLI names the step to run again (`for_step`)."""

    def __init__(self, path: object, problem: str, step: str | None = None) -> None:
        again = f"rerun `python -m training {step}`" if step else "run this step again"
        super().__init__(f"{path} {problem}: move it away, then {again}")
        self.path, self.problem, self.step = path, problem, step

    def for_step(self, step: str) -> "PathTakenError":
        return PathTakenError(self.path, self.problem, step)

    def __reduce__(self):
        return PathTakenError, (self.path, self.problem, self.step)
