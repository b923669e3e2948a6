import pytest

from autoshard import _core


def test_json_roundtrip_through_cpp():
    assert _core.json_roundtrip('{"a": [1, 2.5, "x"]}') == '{"a":[1,2.5,"x"]}'


def test_json_error_names_position():
    with pytest.raises(ValueError, match="line 2"):
        _core.json_roundtrip('{"a":\n ]}')


def test_cli_unknown_command_is_reported():
    rc, out, err = _core.cli_main(["frobnicate"])
    assert rc == 2
    assert "unknown command 'frobnicate'" in err
