import pytest

from strkit import (
    camel_case,
    constant_case,
    kebab_case,
    pascal_case,
    snake_case,
    split_words,
)


def test_split_words_on_separators():
    assert split_words("alpha_beta-gamma.delta  epsilon") == [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
    ]


def test_split_words_camel():
    assert split_words("parseJsonResponse") == ["parse", "json", "response"]


def test_split_words_empty():
    assert split_words("") == []
    assert split_words("__--__") == []


def test_snake_case_from_camel():
    assert snake_case("camelCaseName") == "camel_case_name"


def test_snake_case_from_pascal():
    assert snake_case("PascalCase") == "pascal_case"


def test_snake_case_keeps_digits():
    assert snake_case("version2Update") == "version2_update"


def test_snake_case_idempotent():
    assert snake_case("already_snake_case") == "already_snake_case"


def test_kebab_case():
    assert kebab_case("Some Title Words") == "some-title-words"


def test_constant_case():
    assert constant_case("maxRetryCount") == "MAX_RETRY_COUNT"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("parse_json_response", "ParseJsonResponse"),
        ("hello world", "HelloWorld"),
        ("x", "X"),
    ],
    ids=["snake", "words", "single"],
)
def test_pascal_case(name, expected):
    assert pascal_case(name) == expected


def test_camel_case():
    assert camel_case("parse-json-response") == "parseJsonResponse"
    assert camel_case("") == ""
