"""A small renderer for Go's text/template language, enough to check Ollama chat templates without Ollama.

Ollama renders a Modelfile's TEMPLATE with Go's text/template. This module implements the part chat templates use,
with Go's semantics: text and `{{ }}` actions with `{{-` / `-}}` whitespace trimming, comments, `if` / `else if` /
`else` / `end`, `range` over lists (with `$i, $x :=` variables), variable declaration and assignment, fields
(`.Role`, `$.Messages`, `$m.Content`), parenthesized calls, string / number / bool literals, and the built-in
functions and, or, not, eq, ne, lt, le, gt, ge, len, index and slice. Go's truth rule applies: false, 0, nil and
empty strings, lists and maps are false. Anything else raises GoTemplateError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<op>:=|[=(),|])|'
    r"(?P<num>-?\d+(?:\.\d+)?)|(?P<word>\$\w*(?:\.[A-Za-z_]\w*)*|\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
    r"|[A-Za-z_]\w*|\.))"
)


class GoTemplateError(ValueError):
    """The template uses something this renderer does not implement, or fails as Go's would."""


@dataclass
class _Node:
    kind: str  # text | print | set | if | range
    text: str = ""
    tokens: list[str] = field(default_factory=list)
    variables: list[str] = field(default_factory=list)
    body: list[_Node] = field(default_factory=list)
    branches: list[tuple[list[str], list[_Node]]] = field(default_factory=list)  # if: (condition, body)
    otherwise: list[_Node] = field(default_factory=list)


def _lex(action: str) -> list[str]:
    tokens, pos = [], 0
    action = action.strip()
    while pos < len(action):
        match = _TOKEN.match(action, pos)
        if not match or match.end() == pos:
            raise GoTemplateError(f"cannot read {action[pos:]!r} in {{{{{action}}}}}")
        tokens.append(match.group(match.lastgroup))
        pos = match.end()
    return tokens


def _split_actions(template: str) -> list[tuple[str, str]]:
    """[(kind, content)] with kind "text" or "action", whitespace trimming already applied."""
    parts, pos = [], 0
    for match in _ACTION.finditer(template):
        text = template[pos : match.start()]
        if match.group(1):
            text = text.rstrip(" \t\r\n")
        if parts and parts[-1][0] == "trim":
            parts.pop()
            text = text.lstrip(" \t\r\n")
        parts.append(("text", text))
        content = match.group(2)
        if not content.strip().startswith("/*"):
            parts.append(("action", content))
        if match.group(3):
            parts.append(("trim", ""))
        pos = match.end()
    text = template[pos:]
    if parts and parts[-1][0] == "trim":
        parts.pop()
        text = text.lstrip(" \t\r\n")
    parts.append(("text", text))
    return [p for p in parts if p[0] != "text" or p[1]]


def parse(template: str) -> list[_Node]:
    parts = _split_actions(template)
    return _parse_block(parts, 0, top=True)[0]


def _parse_block(parts, pos: int, top: bool = False):
    """Nodes until an `end` / `else` at this level; returns (nodes, position of that keyword)."""
    nodes = []
    while pos < len(parts):
        kind, content = parts[pos]
        if kind == "text":
            nodes.append(_Node("text", text=content))
            pos += 1
            continue
        tokens = _lex(content)
        head = tokens[0] if tokens else ""
        if head in ("end", "else"):
            if top:
                raise GoTemplateError(f"unexpected {{{{{content.strip()}}}}}")
            return nodes, pos
        if head == "if":
            node = _Node("if")
            condition, pos = tokens[1:], pos + 1
            while True:
                body, pos = _parse_block(parts, pos)
                node.branches.append((condition, body))
                closing = _lex(parts[pos][1])
                pos += 1
                if closing == ["end"]:
                    break
                if closing[:2] == ["else", "if"]:
                    condition = closing[2:]
                    continue
                node.otherwise, pos = _parse_block(parts, pos)
                pos += 1  # the end
                break
            nodes.append(node)
        elif head == "range":
            rest = tokens[1:]
            variables = []
            if ":=" in rest:
                split = rest.index(":=")
                variables, rest = [t for t in rest[:split] if t != ","], rest[split + 1 :]
            body, pos = _parse_block(parts, pos + 1)
            if _lex(parts[pos][1]) != ["end"]:
                raise GoTemplateError("range ... else is not supported")
            nodes.append(_Node("range", tokens=rest, variables=variables, body=body))
            pos += 1
        elif len(tokens) >= 2 and tokens[0].startswith("$") and tokens[1] in (":=", "="):
            nodes.append(_Node("set", tokens=tokens[2:], variables=[tokens[0], tokens[1]]))
            pos += 1
        elif head in ("with", "define", "template", "block", "break", "continue"):
            raise GoTemplateError(f"{head} is not supported by this renderer")
        else:
            nodes.append(_Node("print", tokens=tokens))
            pos += 1
    if not top:
        raise GoTemplateError("missing {{ end }}")
    return nodes, pos


def truth(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float, str, list, tuple, dict)):
        return bool(value)
    return True


def _show(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_FUNCTIONS = {
    "not": lambda x: not truth(x),
    "eq": lambda x, *ys: any(x == y for y in ys),
    "ne": lambda x, y: x != y,
    "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y,
    "gt": lambda x, y: x > y,
    "ge": lambda x, y: x >= y,
    "len": len,
    "index": lambda x, *keys: _index(x, keys),
    "slice": lambda x, *bounds: x[bounds[0] :] if len(bounds) == 1 else x[bounds[0] : bounds[1]] if bounds else x,
}


def _index(value, keys):
    for key in keys:
        value = value[key]
    return value


class _Scope:
    def __init__(self, root):
        self.frames = [{"$": root}]

    def get(self, name: str):
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        raise GoTemplateError(f"undefined variable {name}")

    def assign(self, name: str, value):
        for frame in reversed(self.frames):
            if name in frame:
                frame[name] = value
                return
        raise GoTemplateError(f"undefined variable {name}")


def _field(value, path: list[str]):
    for name in path:
        if isinstance(value, dict):
            if name not in value:
                raise GoTemplateError(f"no field {name}")
            value = value[name]
        else:
            value = getattr(value, name)
    return value


def _operand(token: str, dot, scope: _Scope):
    if token.startswith('"'):
        return json.loads(token)
    if token.startswith("`"):
        return token[1:-1]
    if re.fullmatch(r"-?\d+", token):
        return int(token)
    if re.fullmatch(r"-?\d+\.\d+", token):
        return float(token)
    if token in ("true", "false"):
        return token == "true"
    if token == "nil":
        return None
    if token == ".":
        return dot
    if token.startswith("."):
        return _field(dot, token[1:].split("."))
    if token.startswith("$"):
        name, _, rest = token.partition(".")
        value = scope.get(name)
        return _field(value, rest.split(".")) if rest else value
    raise GoTemplateError(f"unknown word {token!r}")


def _evaluate(tokens: list[str], dot, scope: _Scope):
    """A pipeline without `|`: one operand, or a function applied to operands (parentheses nest)."""
    if "|" in tokens:
        raise GoTemplateError("pipelines with | are not supported by this renderer")
    args, pos = [], 0
    while pos < len(tokens):
        token = tokens[pos]
        if token == "(":
            depth, end = 1, pos + 1
            while depth:
                depth += {"(": 1, ")": -1}.get(tokens[end], 0)
                end += 1
            args.append(("value", _evaluate(tokens[pos + 1 : end - 1], dot, scope)))
            pos = end
        else:
            args.append(("word", token))
            pos += 1
    if not args:
        raise GoTemplateError("empty action")
    kind, head = args[0]
    if kind == "word" and head in _FUNCTIONS:
        values = [v if k == "value" else _operand(v, dot, scope) for k, v in args[1:]]
        return _FUNCTIONS[head](*values)
    if kind == "word" and head in ("and", "or"):
        result = None
        for k, v in args[1:]:
            result = v if k == "value" else _operand(v, dot, scope)
            if truth(result) != (head == "and"):
                return result
        return result
    if len(args) != 1:
        raise GoTemplateError(f"{head!r} is not a function this renderer knows")
    return head if kind == "value" else _operand(head, dot, scope)


def _run(nodes: list[_Node], dot, scope: _Scope, out: list[str]) -> None:
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "print":
            out.append(_show(_evaluate(node.tokens, dot, scope)))
        elif node.kind == "set":
            name, op = node.variables
            value = _evaluate(node.tokens, dot, scope)
            if op == ":=":
                scope.frames[-1][name] = value
            else:
                scope.assign(name, value)
        elif node.kind == "if":
            for condition, body in node.branches:
                if truth(_evaluate(condition, dot, scope)):
                    _block(body, dot, scope, out)
                    break
            else:
                _block(node.otherwise, dot, scope, out)
        elif node.kind == "range":
            items = _evaluate(node.tokens, dot, scope) or []
            for index, item in enumerate(items):
                frame = {}
                if len(node.variables) == 1:
                    frame[node.variables[0]] = item
                elif len(node.variables) == 2:
                    frame[node.variables[0]], frame[node.variables[1]] = index, item
                _block(node.body, item, scope, out, frame)


def _block(nodes, dot, scope: _Scope, out, frame=None) -> None:
    scope.frames.append(frame or {})
    try:
        _run(nodes, dot, scope, out)
    finally:
        scope.frames.pop()


def render(template: str, data: dict[str, Any]) -> str:
    """Render a Go text/template with `data` as both `.` and `$`."""
    out: list[str] = []
    _run(parse(template), data, _Scope(data), out)
    return "".join(out)
