"""The suite's own launcher: a plain command forks from the pre-imported zygote. When something the test process
imports changes a variable that torch, transformers or huggingface_hub read at import, every command would
silently start a fresh interpreter instead, and the suite would take several times as long."""

from __future__ import annotations


def test_a_command_without_its_own_environment_forks_from_the_zygote(baton_cli):
    import transformers.models.llama.modeling_llama  # noqa: F401  # what training tests import, with its side effects

    before = baton_cli.fresh_starts
    p = baton_cli("config", check=True)
    assert '"run"' in p.stdout
    assert baton_cli.fresh_starts == before, "the command started a fresh interpreter, not a fork of the zygote"
    baton_cli("config", fresh=True, check=True)
    assert baton_cli.fresh_starts == before + 1
