"""Strict reading of YAML input files with line numbers in every error.

`load` parses a file and remembers the line of every key; `Section` reads one mapping field by
field and, when done, rejects keys nobody asked for (so a misspelt key is an error, with a
suggestion, instead of a silently ignored setting).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import InputError
from .units import parse_size

_MISSING = object()


@dataclass
class Document:
    """Parsed YAML plus the line of every key path, e.g. ("topology", "groups") -> 12."""

    source: str
    data: object
    lines: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)    # key path -> "--set KEY=VALUE" that set it

    def override_of(self, path: tuple) -> str | None:
        """The --set that gave this path (or a section above it) its value, if any."""
        while path:
            if path in self.overrides:
                return self.overrides[path]
            path = path[:-1]
        return None

    def place(self, path: tuple) -> str:
        """'line N, field a.b', or 'field a.b (from --set ...)' for a value set on the command line."""
        name = dotted(path) or "(top level)"
        given = self.override_of(path)
        if given:
            return f"field {name} (from {given})"
        line = self.line_of(path)
        return f"line {line}, field {name}" if line else f"field {name}"

    def line_of(self, path: tuple) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def load(path, text: str | None = None) -> Document:
    """Parse a YAML file; malformed YAML and duplicate keys are InputErrors with a line."""
    source = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(source, None, "no such file", "check the path, or use the name of a shipped machine (bbsim machine --list)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(source, None, f"cannot read the file ({exc})", "make sure it is a readable UTF-8 text file") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = (exc.problem or exc.context or "syntax error").strip()
        raise InputError(source, where, f"malformed YAML: {problem}",
                         "fix the YAML syntax there (indentation, a missing ':' or an unclosed quote or bracket)") from None
    except yaml.YAMLError as exc:
        raise InputError(source, None, f"malformed YAML: {exc}", "fix the YAML syntax") from None
    doc = Document(source, data)
    if node is not None:
        _record_lines(doc, node, ())
    return doc


def _record_lines(doc: Document, node, path: tuple) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                where = ".".join(str(p) for p in path + (key,))
                raise InputError(doc.source, f"line {line}, field {where}",
                                 f"duplicate key '{key}' (first at line {seen[key]})",
                                 "keep one of the two entries")
            seen[key] = line
            doc.lines[path + (key,)] = line
            _record_lines(doc, value_node, path + (key,))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            doc.lines[path + (index,)] = item.start_mark.line + 1
            _record_lines(doc, item, path + (index,))


def dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Section:
    """One mapping of a Document, read field by field."""

    def __init__(self, doc: Document, path: tuple = (), value=_MISSING):
        self.doc = doc
        self.path = path
        self.value = doc.data if value is _MISSING else value
        self.read: set = set()
        if self.value is None:
            self.value = {}
        if not isinstance(self.value, dict):
            raise self.error(None, f"expected a mapping of keys, found {type(self.value).__name__}",
                             "write this part as 'key: value' lines")

    # -- errors -------------------------------------------------------------------------------
    def where(self, key=None) -> str:
        return self.doc.place(self.path + ((key,) if key is not None else ()))

    def error(self, key, problem: str, fix: str) -> InputError:
        return InputError(self.doc.source, self.where(key), problem, fix)

    def error_at(self, subpath: tuple, problem: str, fix: str) -> InputError:
        """An error about a value nested below this section, e.g. (key, index)."""
        return InputError(self.doc.source, self.doc.place(self.path + tuple(subpath)), problem, fix)

    # -- access -------------------------------------------------------------------------------
    def has(self, key) -> bool:
        return key in self.value

    def raw(self, key, default=_MISSING, hint: str = ""):
        self.read.add(key)
        if key not in self.value or self.value[key] is None:
            if default is _MISSING:
                close = difflib.get_close_matches(str(key), [str(k) for k in self.value if k != key], n=1)
                if close:
                    line = self.doc.line_of(self.path + (close[0],))
                    raise self.error(None, f"missing field '{dotted(self.path + (key,))}'; the unknown key "
                                     f"'{close[0]}' (line {line}) looks like a misspelling of it",
                                     f"rename '{close[0]}' to '{key}'")
                raise self.error(None, f"missing field '{dotted(self.path + (key,))}'",
                                 f"add '{key}:'" + (f" ({hint})" if hint else ""))
            return default
        return self.value[key]

    def number(self, key, default=_MISSING, *, minimum=None, positive=False, integer=False,
               unit: str = "", hint: str = ""):
        value = self.raw(key, default, hint)
        if value is default and default is not _MISSING:
            return value
        what = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise self.error(key, f"expected {what}{' in ' + unit if unit else ''}, found '{value}'",
                             f"write {what}" + (f" ({hint})" if hint else ""))
        if integer and int(value) != value:
            raise self.error(key, f"expected an integer, found {value}", "write a whole number")
        if positive and value <= 0:
            raise self.error(key, f"must be positive, found {value}" + (f" {unit}" if unit else ""),
                             "write a value > 0" + (f" ({hint})" if hint else ""))
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, found {value}",
                             f"write a value >= {minimum}" + (f" ({hint})" if hint else ""))
        return int(value) if integer else float(value)

    def fraction(self, key, default=_MISSING, *, positive=False):
        value = self.number(key, default)
        if value is default and default is not _MISSING:
            return value
        if not 0 <= value <= 1 or (positive and value == 0):
            raise self.error(key, f"must be a fraction in {'(0, 1]' if positive else '[0, 1]'}, found {value}",
                             "write a value such as 0.4")
        return value

    def size(self, key, default=_MISSING):
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            raise self.error(key, str(exc), "write a size such as 1MiB, 512KiB or 4096") from None

    def string(self, key, default=_MISSING):
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.error(key, f"expected text, found {type(value).__name__}", "write a plain value")
        return str(value)

    def choice(self, key, options, default=_MISSING):
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if value not in options:
            raise self.error(key, f"'{value}' is not one of: {', '.join(map(str, options))}",
                             f"use one of: {', '.join(map(str, options))}")
        return value

    def section(self, key, required=True) -> "Section":
        if not required and (key not in self.value or self.value[key] is None):
            self.read.add(key)
            return Section(self.doc, self.path + (key,), {})
        return Section(self.doc, self.path + (key,), self.raw(key))

    def sequence(self, key, default=_MISSING) -> list:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, found '{value}'", "write a YAML list: [a, b] or '- item' lines")
        return value

    def item_section(self, key, index) -> "Section":
        return Section(self.doc, self.path + (key, index), self.value[key][index])

    def int_list(self, key, *, upper: int, default=_MISSING) -> list:
        """Integers in [0, upper): a list whose items are ints or "a-b" ranges, or 'all'."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if value == "all":
            return list(range(upper))
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            try:
                if isinstance(item, str) and "-" in item:
                    low, high = (int(x) for x in item.split("-", 1))
                    out.extend(range(low, high + 1))
                elif isinstance(item, bool):
                    raise ValueError
                else:
                    out.append(int(item))
            except ValueError:
                raise self.error(key, f"'{item}' is not an index or a range such as 0-5",
                                 "write integers, ranges such as '0-5', or 'all'") from None
        bad = [x for x in out if not 0 <= x < upper]
        if bad:
            raise self.error(key, f"index {bad[0]} is out of range (valid: 0 to {upper - 1})",
                             f"use indices from 0 to {upper - 1}")
        return out

    def done(self) -> None:
        """Reject keys that were not read: they are misspellings or unsupported settings."""
        for key in self.value:
            if key not in self.read:
                close = difflib.get_close_matches(str(key), [str(k) for k in self.read], n=1)
                hint = f"did you mean '{close[0]}'?" if close else \
                    f"known keys here: {', '.join(sorted(map(str, self.read))) or '(none)'}"
                raise self.error(key, f"unknown key '{key}'", f"remove it or correct it; {hint}")
