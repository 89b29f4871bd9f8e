"""An adapter whose training run learnt nothing ranks as the base model does, and every face
that says "untuned" says so for it too (`ranks_untuned`)."""

import json

import pytest

from rcllm.errors import RcllmError
from rcllm.model.adapter_file import FORMAT, ranks_untuned


def _adapter(tmp_path, **fields):
    (tmp_path / "adapter.json").write_text(json.dumps({"format": FORMAT, **fields}))
    return tmp_path


def test_no_adapter_and_an_adapter_that_learnt_nothing_rank_untuned(tmp_path):
    assert ranks_untuned("") and ranks_untuned(None)
    assert ranks_untuned(_adapter(tmp_path, learnt=False))


@pytest.mark.parametrize("fields", [{"learnt": True}, {}, {"learnt": None}])
def test_a_trained_adapter_or_one_from_before_the_check_is_tuned(tmp_path, fields):
    assert not ranks_untuned(_adapter(tmp_path, **fields))


def test_a_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(RcllmError):
        ranks_untuned(tmp_path / "nowhere")
