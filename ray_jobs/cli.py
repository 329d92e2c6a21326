"""What every `python -m ray_jobs.*` command line shares: bad input is answered with one line and exit code 2."""
from __future__ import annotations

import argparse
import sys

from benchmark.protocols import unknown_name


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers bad input with one line (`error: ...`) and exit code 2, no usage block, and a value
    outside an option's `choices` with the nearest of them (`unknown_name`); its subcommands' parsers are of the
    same class (argparse makes them with the parent's)."""

    def _check_value(self, action, value):  # argparse's own check of `choices`, which suggests none before 3.14
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, unknown_name("choice", value, action.choices).removesuffix("."))

    def error(self, message: str):
        print(f"error: {message}; see `{self.prog} --help`.", file=sys.stderr)
        sys.exit(2)
