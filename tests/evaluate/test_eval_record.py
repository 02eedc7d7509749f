"""The evaluation record read back from the store: one that is not this format is evaluated again, never a crash."""

import pytest

from baton.evaluate.record import FORMAT, EvalRecord


@pytest.mark.parametrize("tokens_seen", ["abc", [1], 1e400, 2.5])
def test_a_record_whose_token_count_is_not_a_count_is_not_one(tokens_seen):
    good = {"format": FORMAT, "run": "r", "step": 4, "tokens_seen": 1024, "heldout": {}}
    assert EvalRecord.from_json(good).tokens_seen == 1024
    assert EvalRecord.from_json({**good, "tokens_seen": tokens_seen}) is None
