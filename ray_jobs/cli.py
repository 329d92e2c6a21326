"""What every `python -m ray_jobs.*` command line shares: bad input is answered with one line and exit code 2."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers bad input with one line (`error: ...`) and exit code 2, no usage block; its
    subcommands' parsers are of the same class (argparse makes them with the parent's)."""

    def error(self, message: str):
        print(f"error: {message}; see `{self.prog} --help`.", file=sys.stderr)
        sys.exit(2)
