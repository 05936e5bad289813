"""Ollama Modelfiles: write commands so that Ollama reads back exactly what was meant, and read them as Ollama does.

Ollama's parser (ollama/parser/parser.go) has no escapes: a quoted value ends at the first line end where the text
so far is a complete "..." or \"\"\"...\"\"\" string, and characters that are not printable (other than line ends
and tabs) are dropped. So a value is written in quotes only when it can be read back unchanged: one that holds
\"\"\", or a character Ollama would drop, is refused with an ExportError rather than written differently. Nothing
user-given reaches a line outside quotes: comments have their control characters escaped, so a run name with a
newline cannot start a new command. `parse` is a port of Ollama's state machine, quirks included, which the export
check uses to compare every command read back with the one meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hone.core.export.formats import ExportError

# Ollama's commands (what its parser accepts at the start of a line), lower case as it compares them.
COMMANDS = (
    "from",
    "license",
    "template",
    "system",
    "adapter",
    "draft",
    "renderer",
    "parser",
    "parameter",
    "message",
    "requires",
)
# Commands whose value is one text, written as a \"\"\" block (Ollama's name for FROM is "model").
_TEXT_COMMANDS = {
    "model": "FROM",
    "template": "TEMPLATE",
    "system": "SYSTEM",
    "adapter": "ADAPTER",
    "license": "LICENSE",
    "draft": "DRAFT",
    "renderer": "RENDERER",
    "parser": "PARSER",
    "requires": "REQUIRES",
}
_ROLES = ("system", "user", "assistant")
# A value Ollama reads unquoted exactly as written: no spaces, quotes or characters it drops.
_PLAIN = re.compile(r"[A-Za-z0-9._+\-/:]+")
_PARAMETER_NAME = re.compile(r"[A-Za-z0-9_]+")
_BY_HAND = "export gguf and write the Modelfile by hand"


@dataclass(frozen=True)
class Command:
    """One Modelfile command as Ollama stores it: `name` is "model" for FROM, the command word in lower case for
    TEMPLATE, SYSTEM, ADAPTER, ..., the parameter's name for PARAMETER, "message" for MESSAGE (args "role: text")."""

    name: str
    args: str

    @property
    def directive(self) -> str:
        """The command as the Modelfile writes it: FROM, TEMPLATE, ..., "PARAMETER stop", "MESSAGE"."""
        if self.name == "message":
            return "MESSAGE"
        return _TEXT_COMMANDS.get(self.name, f"PARAMETER {self.name}")


class ModelfileSyntaxError(ValueError):
    """Text Ollama's parser refuses; the message gives the line, as Ollama's does."""


def _dropped(value: str) -> list[str]:
    """Characters of `value` that Ollama's parser drops (Go's strconv.IsPrint is Python's str.isprintable)."""
    return sorted({c for c in value if not c.isprintable() and c not in "\n\r\t"})


def quoted(value: str, what: str, *, block: bool = False) -> str:
    """`value` as a Modelfile argument that Ollama reads back unchanged.

    Args:
        value: the text.
        what: what it is, for the error ("the chat template", "stop string '</s>'").
        block: always use a \"\"\" block (texts like templates); otherwise plain words stay bare and other values
            are quoted, in a block only when they hold a quote or a line end.

    Raises:
        ExportError: `value` holds \"\"\" (which would end a block early) or a character Ollama drops.
    """
    if '"""' in value:
        raise ExportError(f'{what} contains """, which a Modelfile value cannot hold', _BY_HAND)
    dropped = _dropped(value)
    if dropped:
        raise ExportError(
            f"{what} contains {', '.join(f'U+{ord(c):04X}' for c in dropped)}, which Ollama drops when "
            "it reads a Modelfile",
            _BY_HAND,
        )
    if block or '"' in value or "\n" in value or "\r" in value:
        return f'"""{value}"""'
    return value if _PLAIN.fullmatch(value) else f'"{value}"'


def comment_text(text: str) -> str:
    """`text` for a comment line: control and other non-printable characters escaped (a newline would end the
    comment and start a command)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def render(commands: list[Command], comments: list[str] = ()) -> str:
    """The Modelfile text: `comments` (escaped) as # lines, then one line (or block) per command."""
    lines = [f"# {comment_text(c)}" for c in comments]
    for command in commands:
        if command.name in _TEXT_COMMANDS:
            block = command.name not in ("model", "adapter", "draft", "requires")
            lines.append(f"{command.directive} {quoted(command.args, command.directive, block=block)}")
        elif command.name == "message":
            role, _, text = command.args.partition(": ")
            if role not in _ROLES:
                raise ExportError(f"MESSAGE role {role!r} is not one of {', '.join(_ROLES)}", _BY_HAND)
            lines.append(f"MESSAGE {role} {quoted(text, f'a {role} MESSAGE', block=True)}")
        else:
            if not _PARAMETER_NAME.fullmatch(command.name):
                raise ExportError(f"{command.name!r} cannot be a Modelfile PARAMETER name", _BY_HAND)
            lines.append(f"PARAMETER {command.name} {quoted(command.args, f'PARAMETER {command.name}')}")
    return "\n".join(lines) + "\n"


# parser states, as in Ollama's parser
_NIL, _NAME, _VALUE, _PARAMETER, _MESSAGE, _COMMENT = range(6)


def _unquote(text: str) -> tuple[str, bool]:
    """A value's text without its quotes, and whether it is complete (Ollama's unquote; no escapes)."""
    if text.startswith('"""'):
        if len(text) >= 6 and text.endswith('"""'):
            return text[3:-3], True
        return "", False
    if text.startswith('"'):
        if len(text) >= 2 and text.endswith('"'):
            return text[1:-1], True
        return "", False
    return text, True


def _step(c: str, state: int, line: int) -> tuple[int, str]:
    """Ollama's parseRuneForState: the next state, and the character to keep ("" for none)."""
    space, newline = c in " \t", c in "\r\n"
    if state == _NIL:
        return (_COMMENT, "") if c == "#" else (_NIL, "") if space or newline else (_NAME, c)
    if state == _NAME:
        if c.isascii() and c.isalpha():
            return _NAME, c
        if space:
            return _VALUE, ""
        raise ModelfileSyntaxError(f"(line {line}): a command word ends in {c!r}")
    if state == _VALUE:
        return (_NIL, c) if space or newline else (_VALUE, c)
    if state in (_PARAMETER, _MESSAGE):
        if c.isascii() and (c.isalpha() or (state == _PARAMETER and (c.isdigit() or c == "_"))):
            return state, c
        if space:
            return _VALUE, ""
        raise ModelfileSyntaxError(f"(line {line}): unexpected {c!r} in a PARAMETER or MESSAGE")
    return (_NIL, "") if newline else (_COMMENT, "")


def parse(text: str) -> list[Command]:
    """The commands Ollama reads from Modelfile `text` (a port of ollama/parser/parser.go's ParseFile).

    Raises:
        ModelfileSyntaxError: where Ollama's parser fails: an unknown command, a MESSAGE role other than system,
            user or assistant, a quoted value never closed, no FROM.
    """
    commands: list[Command] = []
    state, buffer, line, name, role = _NIL, [], 1, "", ""
    for c in text.removeprefix("\ufeff"):
        if c in "\r\n":
            line += 1
        following, keep = _step(c, state, line)
        if following != state:
            word = "".join(buffer)
            if state == _NAME:
                name = _command_name(word, line)
                following = {"parameter": _PARAMETER, "message": _MESSAGE}.get(name, following)
            elif state == _PARAMETER:
                name = word
            elif state == _MESSAGE:
                if word not in _ROLES:
                    raise ModelfileSyntaxError(
                        f"(line {line}): MESSAGE role {word!r} is not one of {', '.join(_ROLES)}"
                    )
                role = word
            elif state == _VALUE:
                value, complete = _unquote(word.strip())
                if not complete or c in " \t":  # inside quotes, or a space within the value: keep reading
                    buffer.append(c)
                    continue
                commands.append(Command(name, f"{role}: {value}" if role else value))
                role = ""
            buffer, state = [], following
        if keep and keep.isprintable():
            buffer.append(keep)
    _end_of_file(commands, state, "".join(buffer), line, name, role)
    return commands


def _command_name(word: str, line: int) -> str:
    """The command a command word names, lower case, FROM as "model"."""
    if word.lower() not in COMMANDS:
        raise ModelfileSyntaxError(f"(line {line}): {word!r} is not a Modelfile command")
    return {"from": "model"}.get(word.lower(), word.lower())


def _end_of_file(commands: list[Command], state: int, word: str, line: int, name: str, role: str) -> None:
    """At the end of the text: add the last command when its value was being read, else check none is left open;
    then check there was a FROM."""
    if state == _VALUE:
        value, complete = _unquote(word.strip())
        if not complete:
            raise ModelfileSyntaxError(f"(line {line}): a quoted value is not closed")
        commands.append(Command(name, f"{role}: {value}" if role else value))
    elif state not in (_NIL, _COMMENT):
        raise ModelfileSyntaxError(f"(line {line}): the file ends inside a command")
    if not any(command.name == "model" for command in commands):
        raise ModelfileSyntaxError("no FROM line")


def differences(read: list[Command], meant: list[Command]) -> list[str]:
    """How the commands read back differ from those meant, in words (empty when they are the same, in order)."""
    out = []
    for i in range(max(len(read), len(meant))):
        got = read[i] if i < len(read) else None
        want = meant[i] if i < len(meant) else None
        if got == want:
            continue
        if want is None:
            out.append(f"command {i + 1} is an extra {got.directive} {got.args[:60]!r}")
        elif got is None:
            out.append(f"command {i + 1} ({want.directive}) is missing")
        else:
            out.append(
                f"command {i + 1} reads as {got.directive} {got.args[:60]!r}, meant {want.directive} {want.args[:60]!r}"
            )
    return out
