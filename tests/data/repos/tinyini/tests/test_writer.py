import pytest

from tinyini import dumps, loads


def test_dumps_layout():
    document = {"a": {"x": "1"}, "b": {"y": "two words"}}
    assert dumps(document) == "[a]\nx = 1\n\n[b]\ny = two words\n"


def test_roundtrip_simple():
    document = {"server": {"host": "example.org", "port": "8080"}, "empty": {}}
    assert loads(dumps(document)) == document


def test_dumps_rejects_bad_key():
    with pytest.raises(ValueError):
        dumps({"a": {" padded ": "1"}})
