import pytest

from tinyini import Config

TEXT = """
[db]
port = 5432
timeout = 2.5
debug = yes
replicas = a.example, b.example,, c.example
"""


@pytest.fixture
def config():
    return Config.from_string(TEXT)


def test_sections(config):
    assert config.sections() == ["db"]


def test_get_is_case_insensitive(config):
    assert config.get("db", "PORT") == "5432"


def test_get_missing(config):
    with pytest.raises(KeyError):
        config.get("db", "user")
    assert config.get("db", "user", "admin") == "admin"


def test_typed_getters(config):
    assert config.getint("db", "port") == 5432
    assert config.getfloat("db", "timeout") == 2.5
    assert config.getint("db", "retries", 3) == 3


def test_getboolean(config):
    assert config.getboolean("db", "debug") is True
    assert config.getboolean("db", "verbose", False) is False


def test_getboolean_rejects_garbage():
    config = Config.from_string("[x]\nflag = maybe\n")
    with pytest.raises(ValueError):
        config.getboolean("x", "flag")


def test_getlist(config):
    assert config.getlist("db", "replicas") == ["a.example", "b.example", "c.example"]


def test_from_file(tmp_path):
    path = tmp_path / "app.ini"
    path.write_text("[app]\nname = demo\n", encoding="utf-8")
    assert Config.from_file(path).get("app", "name") == "demo"
