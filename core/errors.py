"""The exception types the CLI turns into a one-line error and a non-zero exit."""


class DssmError(Exception):
    """A problem the user can fix (bad path, bad columns, bad data): printed as one line."""


class TransientError(DssmError):
    """A failure that may pass on a retry: a service (Spark master, MLflow server) not reachable yet."""


class StageFailed(DssmError):
    """A pipeline stage failed: names the stage and its input so the message says where to look."""

    def __init__(self, stage: str, source: str, cause: BaseException):
        self.stage, self.source, self.cause = stage, source, cause
        reason = str(cause).splitlines()[0] if str(cause).strip() else type(cause).__name__
        if not isinstance(cause, DssmError):
            reason = f"{type(cause).__name__}: {reason[:400]}"
        super().__init__(f"stage {stage} failed on {source}: {reason}")

    @property
    def transient(self) -> bool:
        """Worth a retry: not a problem with the data or the settings."""
        return isinstance(self.cause, TransientError) or not isinstance(self.cause, DssmError)
