"""One root exception and one subclass per stage.

Every message is meant for the person who wrote the SQL or landed the file: it names
the file (and line or row when known) and says what to change.  The CLI maps each
class to an exit code, so scripts and Airflow can tell bad SQL from bad data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """A place in a program or data file, for error messages."""

    path: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        out = self.path
        if self.line is not None:
            out += f":{self.line}"
            if self.column is not None:
                out += f":{self.column}"
        return out


class IncrError(Exception):
    """Root of every error incr raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, location: Location | None = None):
        self.message = message
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)


class ParseError(IncrError):
    """The program file is not valid SQL, or not a program (tables + views)."""

    exit_code = 2


class CompileError(IncrError):
    """The SQL is valid but refers to unknown tables or columns, or mixes types wrongly."""

    exit_code = 2


class NotIncrementalizableError(CompileError):
    """The query uses a construct incr cannot maintain exactly; it is refused, never approximated."""

    exit_code = 2


class InputError(IncrError):
    """A landed batch file is unreadable or inconsistent; the batch is rejected, nothing changes."""

    exit_code = 3


class OutOfRangeError(InputError):
    """A batch makes a view's answer hold a value its column's type cannot hold.

    E.g. a SUM of BIGINTs past ±9.2e18: the run stops at that batch, and the view's answer
    stays as it was.
    """


class StorageError(IncrError):
    """The warehouse (Delta state, answers, ledger) is missing, locked or inconsistent."""

    exit_code = 4
