"""What `baton eval --files` (or eval.files) accepts as a file to score."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from baton.errors import BatonError
from baton.evaluate.heldout import file_rows


def test_a_file_that_is_not_utf8_text_is_refused_naming_it(prepared_data, tmp_path):
    tok = Tokenizer.from_file(str(prepared_data / "tokenizer.json"))
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(BatonError) as e:
        file_rows(png, tok, 0, 16, "text")
    assert str(e.value) == (f"eval file {png} is not UTF-8 text (byte 0 is not UTF-8): give text or JSONL files "
                            "(fix eval.files or --files)")
    text = tmp_path / "ok.txt"
    text.write_text("Grüße, a text file of a few words to score.\n", encoding="utf-8")
    assert file_rows(text, tok, 0, 16, "text").shape[1] >= 2


def test_an_lm_eval_metric_keeps_its_filter_unless_it_is_none():
    from baton.evaluate.lmeval import metric_name

    assert metric_name("acc,none") == "acc" and metric_name("acc") == "acc"
    # Two filters of one metric are two numbers (gsm8k's), never one under the metric's bare name.
    assert {metric_name(k) for k in ("exact_match,strict-match", "exact_match,flexible-extract")} == {
        "exact_match (strict-match)", "exact_match (flexible-extract)"}
