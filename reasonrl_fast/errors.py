"""The one base of every error a user can cause: a bad config, data file, checkpoint or run
directory, an unreachable cluster, a server that cannot start. The CLIs (cli.py) print such an
error as one line and exit 2; any other exception is a bug and keeps its traceback."""


class UserError(Exception):
    """Bad input or a refused action; the message names what is wrong and, where it helps, what
    to do. Subclasses keep their older bases too (ValueError, RuntimeError), so code that
    catches those still catches them."""


class ConfigError(UserError, ValueError):
    """A bad configuration: unknown key, wrong type, or an invalid value (the message names the
    key)."""
