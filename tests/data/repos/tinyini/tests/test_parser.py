import pytest

from tinyini import ParseError, loads

SAMPLE = """
; a comment
# another comment
[server]
host = example.org
Port: 8080

[paths]
root = /srv/app
"""


def test_sections_and_keys():
    assert loads(SAMPLE) == {
        "server": {"host": "example.org", "port": "8080"},
        "paths": {"root": "/srv/app"},
    }


def test_empty_document():
    assert loads("") == {}
    assert loads("\n# only a comment\n") == {}


def test_continuation_lines():
    text = "[motd]\nbanner = first\n    second\n\tthird\n"
    assert loads(text) == {"motd": {"banner": "first\nsecond\nthird"}}


def test_empty_value():
    assert loads("[a]\nkey =\n") == {"a": {"key": ""}}


def test_key_outside_section():
    with pytest.raises(ParseError) as info:
        loads("key = value\n")
    assert info.value.lineno == 1


def test_duplicate_section():
    with pytest.raises(ParseError, match="duplicate section"):
        loads("[a]\n[b]\n[a]\n")


def test_missing_delimiter():
    with pytest.raises(ParseError) as info:
        loads("[a]\nx = 1\njust words\n")
    assert info.value.lineno == 3


def test_unterminated_header():
    with pytest.raises(ParseError):
        loads("[broken\n")
