"""determined.errors: the exception classes Determined's trial code raised or caught, plus
the one localdet raises for a name that exists only so that old code imports."""


class NotServedError(NotImplementedError):
    """A Determined name that means nothing on one machine; its message names what to use."""


def refuse(what: str, instead: str) -> NotServedError:
    """The one-sentence error for a refused name: `what` is not served, `instead` is what to
    do."""
    return NotServedError(f"{what} is not served by localdet (one machine, no cluster); "
                          f"{instead}.")


def exception_line(error: BaseException) -> str:
    """The exception's own message line: `TypeName: first line of the message`."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class InternalException(Exception):
    """A bug in localdet or Determined-compatible glue rather than in the trial."""


class InvalidExperimentException(Exception):
    """The experiment (its trial code or config) is not usable as written."""


class InvalidConfigurationException(InvalidExperimentException):
    """The experiment config is not valid."""


class InvalidDataTypeException(InvalidExperimentException):
    """A data loader returned something the trial runner cannot train on."""


class InvalidModelException(InvalidExperimentException):
    """build_model() returned something the trial runner cannot train."""


class CheckpointNotFound(Exception):
    """A checkpoint that was asked for does not exist."""


class InvalidHP(Exception):
    """Raise it from a trial to say that its hyperparameters cannot work. localdet ends
    the trial as errored at once, without its restarts, with this message; the search goes
    on with the other trials."""

    def __init__(self, msg: str = "...") -> None:
        super().__init__(msg)
        self.msg = msg
