"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class DssmError(Exception):
    """A problem the user can fix (bad path, bad columns, bad data): printed as one line."""
