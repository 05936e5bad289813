"""The Go text/template renderer used to check Ollama templates, against outputs Go's semantics define."""

from __future__ import annotations

import pytest

from hone.core.export.go_template import GoTemplateError, render

MESSAGES = [
    {"Role": "system", "Content": "S"},
    {"Role": "user", "Content": "U1"},
    {"Role": "assistant", "Content": "A1"},
    {"Role": "user", "Content": "U2"},
]


@pytest.mark.parametrize(
    "template, expected",
    [
        ("plain text", "plain text"),
        ("{{ .Name }}!", "Ann!"),
        ("a  \n {{- .Name -}} \n  b", "aAnnb"),  # trim markers eat all adjacent whitespace
        ("a {{/* a comment */}}b", "a b"),
        ('{{ "x\\ny" }}', "x\ny"),
        ("{{ 42 }} {{ true }}", "42 true"),
        ("{{ if .Empty }}yes{{ else }}no{{ end }}", "no"),  # empty string is false
        ("{{ if .Zero }}yes{{ else if .Name }}name{{ else }}no{{ end }}", "name"),
        ('{{ if eq .Name "Bob" "Ann" }}match{{ end }}', "match"),  # eq with several candidates
        ('{{ if ne .Name "Ann" }}x{{ else }}y{{ end }}', "y"),
        ('{{ and 1 0 }} {{ or 0 "" "z" }} {{ not 0 }}', "0 z true"),  # and/or return an operand
        ("{{ len .List }} {{ index .List 1 }} {{ len (slice .List 1) }}", "3 b 2"),
        ("{{ range .List }}[{{ . }}]{{ end }}", "[a][b][c]"),
        ("{{ range $i, $x := .List }}{{ $i }}={{ $x }};{{ end }}", "0=a;1=b;2=c;"),
        ("{{ $n := .Name }}{{ range .List }}{{ $n }}{{ end }}", "AnnAnnAnn"),  # outer variables visible inside
        ("{{ $n := 1 }}{{ range .List }}{{ $n = 2 }}{{ end }}{{ $n }}", "2"),  # = assigns the outer variable
        ("{{ range .List }}{{ $.Name }}{{ end }}", "AnnAnnAnn"),
    ],
)
def test_go_semantics(template, expected):
    data = {"Name": "Ann", "Empty": "", "Zero": 0, "List": ["a", "b", "c"]}
    assert render(template, data) == expected


def test_last_message_idiom_of_ollama_templates():
    """The `$last := eq (len (slice $.Messages $i)) 1` idiom marks only the final message."""
    template = (
        "{{ range $i, $m := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}"
        "{{ $m.Role }}{{ if $last }}!{{ end }} {{ end }}"
    )
    assert render(template, {"Messages": MESSAGES}) == "system user assistant user! "


@pytest.mark.parametrize(
    "template",
    [
        "{{ with .Name }}x{{ end }}",
        "{{ .Name | printf }}",
        "{{ if .Name }}x",
        "{{ end }}",
        "{{ .Missing }}",
        "{{ $undefined }}",
    ],
)
def test_unsupported_or_broken_templates_raise(template):
    with pytest.raises(GoTemplateError):
        render(template, {"Name": "Ann"})
