"""Tools of one's own for the tool box's tests (tests/tools/test_box.py): each a function with a
schema, most of them hostile to the box."""

import os
import sys
import time


def shout(text: str) -> str:
    """
    Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()


def count(n: int, sep: str = ",") -> list:
    """
    The numbers from 1 to n.

    Args:
        n: The last number.
        sep: Unused.
    """
    return list(range(1, n + 1))


def fails(x: int) -> str:
    """
    Always raises.

    Args:
        x: Anything.
    """
    raise KeyError(f"no entry {x}")


def hangs(x: int) -> str:
    """
    Never returns.

    Args:
        x: Anything.
    """
    while True:
        time.sleep(0.01)


def floods(x: int) -> str:
    """
    Returns ten million characters.

    Args:
        x: Anything.
    """
    return "y" * 10_000_000


def hogs(x: int) -> str:
    """
    Asks for 64 GiB.

    Args:
        x: Anything.
    """
    return str(len(bytearray(64 << 30)))


def exits(x: int) -> str:
    """
    Ends its process.

    Args:
        x: Anything.
    """
    sys.stdout.flush()
    os._exit(3)


def spawns(path: str) -> str:
    """
    Leaves a child that writes to a file after the call.

    Args:
        path: The file.
    """
    if os.fork() == 0:
        time.sleep(4)
        with open(path, "w") as f:
            f.write("alive")
        os._exit(0)
    time.sleep(60)
    return "done"


def undocumented(x):
    return x


def calculator(expression: str) -> str:
    """
    A calculator of one's own: products of two integers, each call logged to the file that
    RRL_TOOL_LOG names (how a test sees that a run called it).

    Args:
        expression: Two integers joined by '*'.
    """
    a, b = (int(x) for x in expression.split("*"))
    with open(os.environ["RRL_TOOL_LOG"], "a") as f:
        f.write(f"{expression}\n")
    return str(a * b)
