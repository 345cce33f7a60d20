"""The one error type bbsim raises for bad input.

Every message names the input (a file, or a command-line option), the place inside it (a line
and/or a field), what is wrong, and how to fix it. The CLI prints it and exits with status 2;
it never shows a traceback for bad input.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: a machine file, a workload, a Darshan log, a snapshot or an option."""

    def __init__(self, source: str, where: str | None, problem: str, fix: str):
        self.source = str(source)
        self.where = where
        self.problem = problem
        self.fix = fix
        super().__init__(str(self))

    def __reduce__(self):          # picklable, so it can cross a process boundary
        return (InputError, (self.source, self.where, self.problem, self.fix))

    def __str__(self) -> str:
        place = self.source if not self.where else f"{self.source}: {self.where}"
        return f"{place}: {self.problem}\n  fix: {self.fix}"
