import pytest

from rcllm.config import RcllmConfig, load
from rcllm.errors import RcllmError


def test_defaults_validate():
    cfg = load(RcllmConfig)
    assert cfg.reuse.method == "rcllm"
    assert cfg.model.dtype == "float32"


def test_dotted_overrides_convert_types(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reuse:\n  item_ratio: 0.5\nmodel:\n  threads: 1\n")
    cfg = load(RcllmConfig, str(path), ["reuse.history_ratio=0.2", "reuse.method=epic"])
    assert cfg.reuse.item_ratio == 0.5
    assert cfg.reuse.history_ratio == 0.2
    assert cfg.reuse.method == "epic"
    assert cfg.model.threads == 1


@pytest.mark.parametrize("override,needle", [
    ("reuse.item_ratio=1.5", "item_ratio"),
    ("reuse.method=magic", "reuse.method"),
    ("reuse.nope=1", "nope"),
    ("model.threads=abc", "model.threads"),
    ("noequals", "key=value"),
])
def test_bad_overrides_name_the_problem(override, needle):
    with pytest.raises(RcllmError, match=needle):
        load(RcllmConfig, None, [override])


def test_every_option_has_help_text():
    from rcllm.config import describe

    lines = describe(RcllmConfig)
    assert len(lines) >= 20
    for line in lines:
        assert line.rstrip().endswith(")"), f"option without help: {line}"
