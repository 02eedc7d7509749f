"""`baton report` and `baton status` of a run with no verified checkpoint in its store yet."""

from __future__ import annotations

from baton.cli import main


def test_report_and_status_say_there_is_no_verified_checkpoint_yet(make_config, tmp_path, capsys):
    cfg = str(make_config())
    out = tmp_path / "report"
    assert main(["report", "-c", cfg, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert ("- progress: no verified checkpoint in the store yet (the next `baton train` starts at step 0 of 20)"
            in md)
    assert "step 0 of" not in md.replace("starts at step 0 of", "") and "last training loss" not in md
    assert main(["status", "-c", cfg]) == 0
    text = capsys.readouterr().out
    assert ("pointer: none: no verified checkpoint in the store yet (the next `baton train` starts at step 0 of 20)"
            in text.splitlines())
