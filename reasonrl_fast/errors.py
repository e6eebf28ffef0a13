"""The one base of every error a user can cause: a bad config, data file, checkpoint or run
directory, an unreachable cluster, a server that cannot start. The CLIs (cli.py) print such an
error as one line and exit 2; any other exception is a bug and keeps its traceback."""


def one_line(message: str) -> str:
    """The message on one line (some libraries' messages span several): how the CLIs print an
    error, and how a wrapped library error is quoted in one of ours."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


class UserError(Exception):
    """Bad input or a refused action; the message names what is wrong and, where it helps, what
    to do. Subclasses keep their older bases too (ValueError, RuntimeError), so code that
    catches those still catches them."""


class ConfigError(UserError, ValueError):
    """A bad configuration: unknown key, wrong type, or an invalid value (the message names the
    key)."""
