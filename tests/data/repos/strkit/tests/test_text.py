import pytest

from strkit import count_words, normalize_whitespace, slugify, truncate


def test_normalize_whitespace():
    assert normalize_whitespace("  a \t b\n\nc  ") == "a b c"


def test_count_words():
    assert count_words("Don't panic, it's only 42 words.") == 6
    assert count_words("   ") == 0


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"
    assert truncate("exact", 5) == "exact"


def test_truncate_negative_width():
    with pytest.raises(ValueError):
        truncate("text", -1)


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_custom_separator():
    assert slugify("  Many   spaces here ", sep="_") == "many_spaces_here"


def test_slugify_empty_separator_rejected():
    with pytest.raises(ValueError):
        slugify("x", sep="")
