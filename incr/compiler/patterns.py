r"""DuckDB's regular expressions (RE2's syntax, DuckDB's options) as Java reads them.

A program's SQL means what DuckDB computes, and Spark reads a pattern as Java's
``java.util.regex`` does.  The two agree on the common syntax and not on the rest, silently
as often as not:

- ``.`` matches every character but ``\n`` in RE2; Java's also stops at ``\r``, ``\u0085``,
  ``\u2028`` and ``\u2029``.  ``$`` is the end of the text in RE2; Java's also matches
  before a last line break.  In multi-line mode (``(?m)``) RE2's lines end at ``\n`` only.
- ``\b`` and ``\B`` are ASCII word boundaries in RE2 and Unicode ones in Java;
  ``\s`` leaves out the vertical tab in RE2; ``\v`` is the vertical tab alone in RE2 and
  every vertical space in Java.
- RE2 reads ``[[:alpha:]]`` as a POSIX class, ``[`` and ``&&`` inside a class as
  themselves, ``{`` that starts no repetition as itself, and ``(?P<name>…)`` as a named
  group; Java reads the first three as classes' unions and intersections, and fails on
  the last two.
- ``(?i)`` folds case beyond ASCII in RE2 and only within ASCII in Java (without ``u``).
- DuckDB's options (``'i'``, ``'s'``, ``'l'`` …) are arguments Spark's functions do not
  take: they become flags and escapes of the pattern here.

RE2's ``(?U)`` (quantifiers lazy unless marked) has no Java flag: each quantifier is
written with the other greediness.  Everything RE2 refuses (look-around, back-references,
possessive quantifiers, ``\Z`` …) is refused here too, where the view is written, as is
what Java cannot be made to read as RE2 does (``\C``, one byte; a Unicode class under case
folding, which RE2 widens by every character that folds into it); a pattern must be
written out as text, since it is translated when the view is compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from incr.errors import CompileError

#: DuckDB's options of a pattern (``regexp_matches`` and the others; ``g`` only replaces).
OPTIONS = frozenset("cilmnps")

#: RE2's ``[[:name:]]`` as Java's ``\p{…}`` (both ASCII classes of the same characters).
_POSIX = {
    "alnum": "Alnum", "alpha": "Alpha", "ascii": "ASCII", "blank": "Blank", "cntrl": "Cntrl",
    "digit": "Digit", "graph": "Graph", "lower": "Lower", "print": "Print", "punct": "Punct",
    "space": "Space", "upper": "Upper", "xdigit": "XDigit",
}
#: Which of them hold ``k`` or ``s``, so that case folding widens them beyond ASCII.
_POSIX_FOLDS = frozenset({"alnum", "alpha", "ascii", "graph", "lower", "print", "upper"})
#: The characters beyond ASCII that fold to ``k`` and ``s``: the Kelvin sign, the long s.
_FOLDED = r"\x{212A}\x{17F}"
#: RE2's ``\s``: Java's includes the vertical tab, RE2's does not.
_SPACE = r"\t\n\f\r "
#: RE2's ASCII word character, spelled so that no flag of Java's widens it.
_WORD = "0-9A-Za-z_"
#: Unicode's general categories, which both engines name alike (``\pL``, ``\p{Lu}``).
_CATEGORIES = frozenset({
    "C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu", "M", "Mc", "Me", "Mn",
    "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk",
    "Sm", "So", "Z", "Zl", "Zp", "Zs"})
#: RE2's repetitions count at most this many.
_MOST_REPEATS = 1000
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])")


@dataclass(frozen=True)
class JavaPattern:
    """A pattern Java reads as RE2 reads the original, and its capturing groups."""

    text: str
    groups: int


def java_pattern(pattern: str, options: str = "", *, call: str,
                 every: bool = False) -> JavaPattern:
    r"""DuckDB's ``pattern`` under DuckDB's ``options`` as a Java pattern of the same matches.

    Args:
        pattern: the pattern as the program writes it (RE2's syntax).
        options: DuckDB's options letters: ``c``/``i`` case (the last one wins), ``s``
            ``.`` matches ``\n`` and ``m``/``n``/``p`` it does not (the last one wins),
            ``l`` the pattern is literal text.
        call: how an error names the call (``regexp_matches`` …).
        every: the call also takes ``g`` (every match, ``regexp_replace``), which is its
            own to read and leaves the pattern as it is.

    Raises:
        CompileError: an option DuckDB does not take, or a construct RE2 refuses or Java
            cannot be made to read as RE2 does, named with what to write instead.
    """
    unknown = set(options) - OPTIONS - ({"g"} if every else set())
    if unknown:
        g = "'g' (every match), " if every else ""
        raise CompileError(f"{call} takes no option {''.join(sorted(unknown))!r}; its "
                           f"options are {g}'i' or 'c' (case), 's' or 'n' (whether '.' "
                           f"matches a line break) and 'l' (literal)")
    fold = _last(options, "i", "c") == "i"
    dot_nl = _last(options, "s", "mnp") == "s"
    if "l" in options:
        text = "".join(_literal(c) for c in pattern)
        return JavaPattern(f"(?iu){text}" if fold else text, 0)
    scan = _Scan(pattern, call, _Flags(fold, False, dot_nl))
    text = scan.run()
    return JavaPattern(f"(?iu){text}" if fold else text, scan.groups)


def _last(options: str, yes: str, no: str) -> str | None:
    """``yes`` when its last letter in ``options`` comes after every one of ``no``'s."""
    at = max((options.rfind(c) for c in yes), default=-1)
    against = max((options.rfind(c) for c in no), default=-1)
    if at == against == -1:
        return None
    return yes if at > against else no


def _literal(c: str) -> str:
    """``c`` as a Java pattern that matches it alone."""
    return "\\" + c if c.isascii() and not c.isalnum() and c not in "\n\t\r" else c


@dataclass
class _Flags:
    r"""RE2's flags in force where the scan is.

    Case folding (``i``), multi-line (``m``), ``.`` matching ``\n`` (``s``), and
    quantifiers lazy unless marked greedy (``U``).
    """

    fold: bool
    multiline: bool
    dot_nl: bool
    ungreedy: bool = False

    def copy(self) -> _Flags:
        return _Flags(self.fold, self.multiline, self.dot_nl, self.ungreedy)


@dataclass
class _Scan:
    """One left-to-right pass over an RE2 pattern, writing Java's."""

    pattern: str
    call: str
    flags: _Flags
    at: int = 0
    groups: int = 0
    out: list[str] = field(default_factory=list)
    scopes: list[_Flags] = field(default_factory=list)
    #: what was written last: "atom" takes a quantifier, "repeated" (one) or "lazy" (one
    #: and its ``?``) takes none, nor does "none" (the start, an anchor, ``|``, ``(``)
    last: str = "none"

    def refuse(self, what: str, instead: str = "") -> CompileError:
        fix = f"; {instead}" if instead else ""
        return CompileError(f"{self.call}: the pattern '{self.pattern}' {what}{fix}")

    def run(self) -> str:
        p = self.pattern
        while self.at < len(p):
            c = p[self.at]
            self.at += 1
            if c == "\\":
                self._escape()
            elif c == "[":
                self._atom(self._class())
            elif c == "(":
                self._open()
            elif c == ")":
                if not self.scopes:
                    raise self.refuse("closes a group it did not open (')')")
                self.flags = self.scopes.pop()
                self._atom(")")
            elif c in "*+?":
                self._quantifier(c)
            elif c == "{":
                m = _REPEAT.match(p, self.at - 1)
                if m is None:  # RE2 reads a brace that starts no repetition as itself
                    self._atom(r"\{")
                else:
                    self.at = m.end()
                    self._repeat(m)
            elif c == "}":
                self._atom(r"\}")
            elif c == "|":
                self._put("|")
            elif c == ".":
                self._atom(r"[\s\S]" if self.flags.dot_nl else r"[^\n]")
            elif c == "^":
                self._put(r"(?:\A|(?<=\n))" if self.flags.multiline else r"\A")
            elif c == "$":
                self._put(r"(?=\n|\z)" if self.flags.multiline else r"\z")
            else:
                self._atom(_literal(c) if c in "#&-]" else c)
        if self.scopes:
            raise self.refuse("leaves a group open (missing ')')")
        return "".join(self.out)

    # -- what is written -------------------------------------------------------------------
    def _atom(self, text: str) -> None:
        """Something a quantifier may follow (a character, a class, a group's end)."""
        self.out.append(text)
        self.last = "atom"

    def _put(self, text: str) -> None:
        """Something no quantifier may follow (an anchor, ``|``, a group's start)."""
        self.out.append(text)
        self.last = "none"

    def _quantifier(self, c: str) -> None:
        if c == "?" and self.last == "repeated":  # the other greediness (lazy but under U)
            self.out[-1] = self.out[-1][:-1] if self.flags.ungreedy else self.out[-1] + "?"
            self.last = "lazy"
            return
        self._may_repeat(c)
        self._repeated(c)

    def _repeated(self, quantifier: str) -> None:
        """Writes ``quantifier``: lazy under RE2's ``U``, which Java has no flag for."""
        self.out.append(quantifier + ("?" if self.flags.ungreedy else ""))
        self.last = "repeated"

    def _repeat(self, m: re.Match[str]) -> None:
        counts = [int(n) for n in (m.group(1), m.group(3)) if n]
        if any(n > _MOST_REPEATS for n in counts):
            raise self.refuse(f"repeats more than {_MOST_REPEATS} times ({m.group(0)})",
                              "RE2 counts no further")
        if len(counts) == 2 and counts[1] < counts[0]:
            raise self.refuse(f"has a repetition whose bounds are reversed ({m.group(0)})")
        self._may_repeat(m.group(0))
        self._repeated(m.group(0))

    def _may_repeat(self, what: str) -> None:
        """Raises unless what was written last takes the quantifier ``what``."""
        if self.last in ("repeated", "lazy"):
            raise self.refuse(f"repeats a repetition ({what!r} after a quantifier)",
                              "RE2 has no possessive quantifiers; put the repeated part "
                              "in a group: (?:a*)+")
        if self.last != "atom":
            raise self.refuse(f"has {what!r} with nothing before it to repeat",
                              f"write \\{what[0]} for the character itself")

    # -- groups ----------------------------------------------------------------------------
    def _open(self) -> None:
        p, start = self.pattern, self.at - 1
        self.scopes.append(self.flags.copy())
        if not p.startswith("?", self.at):
            self.groups += 1
            self._put("(")
            return
        if p.startswith("?P<", self.at):
            end = p.find(">", self.at)
            name = p[self.at + 3:end] if end >= 0 else ""
            if end < 0 or not re.fullmatch(r"[A-Za-z0-9_]+", name):
                raise self.refuse("names a group other than with letters, digits and '_'")
            self.at = end + 1
            self.groups += 1
            self._put("(")  # numbered as RE2 numbers it; Java's names take no '_'
            return
        if p.startswith("?:", self.at):
            self.at += 2
            self._put("(?:")
            return
        m = _FLAG_GROUP.match(p, start)
        if m is None or not (m.group(1) or m.group(2)):
            raise self.refuse(f"has a group RE2 does not read ({p[start:start + 4]}…)",
                              "RE2 has no look-ahead, look-behind, atomic groups or "
                              "comments; (?P<name>…) names a group")
        on, off = m.group(1), m.group(2) or ""
        bad = set(on + off) - set("imsU")
        if bad:
            raise self.refuse(f"sets the flag {''.join(sorted(bad))!r}, which RE2 does not "
                              f"know", "RE2's flags are i, m, s and U")
        self.at = m.end()
        scoped = m.group(3) == ":"
        if not scoped:
            self.scopes.pop()  # (?i) holds until the end of the group it is in
        flags = self.flags
        for letter, value in [(x, True) for x in on] + [(x, False) for x in off]:
            if letter == "i":
                flags.fold = value
            elif letter == "m":
                flags.multiline = value
            elif letter == "s":
                flags.dot_nl = value
            else:
                flags.ungreedy = value
        java = ("iu" if "i" in on else "") + ("-i" if "i" in off else "")
        if scoped:
            self._put(f"(?{java}:" if java else "(?:")
        elif java:
            self._put(f"(?{java})")

    # -- escapes ---------------------------------------------------------------------------
    def _escape(self) -> None:
        p = self.pattern
        if self.at >= len(p):
            raise self.refuse("ends with a lone backslash")
        c = p[self.at]
        self.at += 1
        if c == "Q":
            end = p.find(r"\E", self.at)
            quoted = p[self.at:] if end < 0 else p[self.at:end]
            self.at = len(p) if end < 0 else end + 2
            for q in quoted:
                self._atom(_literal(q))
            return
        if c in "bB":  # RE2's word boundaries are ASCII whatever the case folding
            w = f"[{_WORD}]"
            self._put(f"(?-i:(?<={w})(?!{w})|(?<!{w})(?={w}))" if c == "b" else
                      f"(?-i:(?<={w})(?={w})|(?<!{w})(?!{w}))")
        elif c in "Az":
            self._put("\\" + c)
        else:
            self._atom(self._class_escape(c, in_class=False))

    def _class_escape(self, c: str, in_class: bool) -> str:
        r"""The Java text of RE2's ``\c`` (its backslash read), as an atom or in a class."""
        p = self.pattern
        if c == "s":
            return _SPACE if in_class else f"[{_SPACE}]"
        if c == "S":
            return f"[^{_SPACE}]"
        if c == "w":
            return self._word(in_class, negated=False)
        if c == "W":
            return self._word(in_class, negated=True)
        if c in "dD":
            return "\\" + c
        if c == "v":
            return r"\x0B"
        if c in "aftnr":
            return "\\" + c
        if c == "x":
            m = re.compile(r"\{[0-9A-Fa-f]{1,6}\}|[0-9A-Fa-f]{2}").match(p, self.at)
            if m is None:
                raise self.refuse(r"has \x without two hex digits or {hex}")
            self.at = m.end()
            return r"\x" + m.group(0)
        if c in "pP":
            return self._property(c == "P")
        if c.isdigit():
            raise self.refuse(f"has \\{c}", "RE2 has no back-references or octal "
                              "escapes; write a character as \\x{hex}")
        if c.isascii() and not c.isalnum():
            return "\\" + c
        if c == "C":
            raise self.refuse("has \\C (one byte), which Java has no form of",
                              "match characters: '.'")
        raise self.refuse(f"has \\{c}, which RE2 does not read",
                          "see DuckDB's regular expression syntax (RE2's)")

    def _word(self, in_class: bool, negated: bool) -> str:
        r"""RE2's ``\w`` (``\W``): ASCII, and folding case the Kelvin sign and long s too.

        RE2 folds them to ``k`` and ``s``.
        """
        chars = _WORD + (_FOLDED if self.flags.fold else "")
        if negated:
            return f"[^{chars}]"
        return chars if in_class else f"[{chars}]"

    def _property(self, negated: bool) -> str:
        p = self.pattern
        if p.startswith("{", self.at):
            end = p.find("}", self.at)
            if end < 0:
                raise self.refuse(r"has \p{ without its closing brace")
            name, self.at = p[self.at + 1:end], end + 1
        elif self.at < len(p):
            name, self.at = p[self.at], self.at + 1
        else:
            raise self.refuse(r"ends with \p")
        if name.startswith("^"):
            name, negated = name[1:], not negated
        if self.flags.fold and name != "Any":
            raise self.refuse(f"folds case over the class \\p{{{name}}}",
                              "RE2 widens a Unicode class by case folding and Java does "
                              "not; list the cases without 'i'")
        if name == "Any":
            return r"[^\x{0}-\x{10FFFF}]" if negated else r"[\x{0}-\x{10FFFF}]"
        if not re.fullmatch(r"[A-Za-z_]+", name):
            raise self.refuse(f"names the Unicode class {name!r}, which RE2 does not know")
        java = name if name in _CATEGORIES else f"Is{name}"
        return f"\\{'P' if negated else 'p'}{{{java}}}"

    # -- classes ---------------------------------------------------------------------------
    def _posix(self, name: str, negated: bool) -> str:
        r"""RE2's ``[:name:]`` (``[:^name:]``) as Java's, inside a class.

        Folding case, RE2 widens a class by every character that folds to one of its own:
        a class of ``k`` or ``s`` takes the Kelvin sign and the long s, and ``[:upper:]``
        and ``[:lower:]`` take both cases.  Java folds no ``\p{…}``, so they are written out.
        """
        java = _POSIX[name]
        if not self.flags.fold or name not in _POSIX_FOLDS:
            return f"\\{'P' if negated else 'p'}{{{java}}}"
        java = "Alpha" if name in ("upper", "lower") else java
        if negated:
            return f"[\\P{{{java}}}&&[^{_FOLDED}]]"
        return f"\\p{{{java}}}{_FOLDED}"

    def _class(self) -> str:
        """A bracketed class, its ``[`` read, as Java's."""
        p = self.pattern
        out = ["["]
        if p.startswith("^", self.at):
            out.append("^")
            self.at += 1
        first = True
        while True:
            if self.at >= len(p):
                raise self.refuse("leaves a class open (missing ']')")
            c = p[self.at]
            self.at += 1
            if c == "]" and not first:
                break
            if c == "]":  # first in the class, RE2 reads it as itself
                out.append(r"\]")
                first = False
                continue
            first = False
            if c == "[" and p.startswith(":", self.at):
                end = p.find(":]", self.at + 1)
                name = p[self.at + 1:end] if end >= 0 else ""
                negated = name.startswith("^")
                name = name.lstrip("^")
                if name == "word":
                    out.append(self._word(in_class=not negated, negated=negated))
                elif name in _POSIX:
                    out.append(self._posix(name, negated))
                else:
                    raise self.refuse(f"has the class [:{name}:], which RE2 does not know")
                self.at = end + 2
            elif c == "\\":
                if self.at >= len(p):
                    raise self.refuse("ends with a lone backslash")
                e = p[self.at]
                self.at += 1
                if e in "bBAzQE":
                    raise self.refuse(f"has \\{e} in a class, which RE2 does not read")
                out.append(self._class_escape(e, in_class=True))
            elif c in "[&":  # itself in RE2; a nested class or an intersection in Java
                out.append("\\" + c)
            else:
                out.append(c)
        return "".join(out) + "]"


#: What follows a backslash in :func:`java_pattern`'s text that RE2 reads as Java does.
_ALIKE_ESCAPES = frozenset("AzntfrdD")
_HEX = re.compile(r"x(\{[0-9A-Fa-f]{1,6}\}|[0-9A-Fa-f]{2})")
#: The groups of :func:`java_pattern`'s text RE2 reads as Java does: Java's ``u`` (Unicode
#: case folding) is what RE2's ``i`` always does.
_ALIKE_GROUPS = {"(?:": "(?:", "(?iu)": "(?i)", "(?iu:": "(?i:", "(?-i)": "(?-i)",
                 "(?-i:": "(?-i:"}


def re2_form(java: str) -> str | None:
    r"""The text RE2 reads as Java reads ``java``, a pattern :func:`java_pattern` wrote.

    None unless every part of it is one RE2 reads alike: characters, escaped punctuation,
    ``\A``, ``\z``, ``\d``, ``\x…``, classes of them (and ``[\s\S]``), quantifiers, groups
    and ``|``.  What :func:`java_pattern` writes only for Java (look-around for ``\b`` and
    a multi-line ``^`` or ``$``, ``\p{…}``, nested classes) gives None, and so does
    anything it does not write.  The driver (DuckDB, RE2) then matches a translated pattern
    as Spark does, from one text.
    """
    out: list[str] = []
    at = 0
    while at < len(java):
        c = java[at]
        if c in "\\[":  # an escape or a class, kept whole when RE2 reads it alike
            end = (_alike_escape if c == "\\" else _alike_class)(java, at)
            if end is None:
                return None
            out.append(java[at:end])
            at = end
        elif c == "(":
            group = next((g for g in _ALIKE_GROUPS if java.startswith(g, at)), None)
            if group is None and java.startswith("(?", at):
                return None
            out.append(_ALIKE_GROUPS[group] if group else "(")
            at += len(group) if group else 1
        elif c in ".^$":
            return None  # java_pattern writes none of them bare
        else:
            out.append(c)
            at += 1
    return "".join(out)


def _alike_escape(java: str, at: int) -> int | None:
    """Where the escape at ``at`` ends, if RE2 reads it as Java does."""
    if at + 1 >= len(java):
        return None
    e = java[at + 1]
    if e == "x":
        m = _HEX.match(java, at + 1)
        return m.end() if m else None
    if e in _ALIKE_ESCAPES or (e.isascii() and not e.isalnum()):
        return at + 2
    return None


def _alike_class(java: str, at: int) -> int | None:
    """Where the class at ``at`` ends, if RE2 reads it as Java does."""
    end = java.find("]", at + 1)
    while end > 0 and _escaped(java, end):
        end = java.find("]", end + 1)
    if end < 0:
        return None
    body = java[at + 1:end].removeprefix("^")
    if body == r"\s\S":
        return end + 1
    i = 0
    while i < len(body):
        if body[i] == "\\":
            taken = _alike_escape(body, i)
            if taken is None:
                return None
            i = taken
        elif body[i] in "[&" or (i == 0 and body[i] == "]"):
            return None  # a nested class or an intersection in Java
        else:
            i += 1
    return end + 1 if body else None


def _escaped(text: str, at: int) -> bool:
    """Whether the character at ``at`` has an odd run of backslashes before it."""
    run = 0
    while at - run - 1 >= 0 and text[at - run - 1] == "\\":
        run += 1
    return run % 2 == 1
