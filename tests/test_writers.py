"""Every writer of a model folder (specblock-export, sbj.save_drafter, sbj.save_target, the trainer's
export) refuses a shipped folder under assets/ unless told to overwrite, writes the same engine
config from the API as from the CLI, and writes its files with the user's umask
(specblock_jax/writing.py). The refusal tests point at folders under the real assets/ that do not
exist, so a broken refusal leaves a stray folder there rather than a replaced shipped model."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import specblock_jax as sbj
from specblock_jax import writing
from specblock_jax_cli.train import export

ASSETS = writing.ASSETS
NEVER = ASSETS / "drafters" / "_never_written_by_tests"  # shipped (under assets/), absent


@pytest.fixture(scope="module")
def shipped():
    """(the shipped target, the shipped EAGLE-3 drafter loaded for it), as the README loads them."""
    target = sbj.load_target(str(ASSETS / "target"))
    return target, sbj.load_drafter(ASSETS / "drafters" / "eagle3", target)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_assets_folder_is_the_one_the_clis_find_the_default_target_in():
    assert (ASSETS / "target" / "config.json").is_file() and (ASSETS / "drafters" / "eagle3").is_dir()
    assert writing.shipped(ASSETS / "drafters" / "eagle3") and writing.shipped(ASSETS)
    assert writing.shipped(ASSETS / "target" / ".." / "x")  # resolved first
    assert not writing.shipped(ASSETS.parent / "outputs" / "x")


def test_export_refuses_a_shipped_folder_with_exit_2_naming_it(capsys):
    before = {f.name: f.read_bytes() for f in (ASSETS / "drafters" / "eagle3").iterdir()}
    for out in (ASSETS / "drafters" / "eagle3", NEVER):
        with pytest.raises(SystemExit) as exit_:
            export.main([str(ASSETS / "drafters" / "eagle3"), str(out), "--format", "speculators",
                         "--target", str(ASSETS / "target")])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == (f"specblock-export: error: {out}: is a shipped folder (under {ASSETS}); write "
                       "elsewhere, or pass --overwrite to replace it")
    assert not NEVER.exists()
    assert {f.name: f.read_bytes() for f in (ASSETS / "drafters" / "eagle3").iterdir()} == before


def test_save_drafter_and_save_target_refuse_a_shipped_folder(shipped):
    target, drafter = shipped
    with pytest.raises(writing.ShippedFolderError, match=f"{NEVER}: is a shipped folder .* overwrite=True"):
        sbj.save_drafter(*drafter, NEVER)
    with pytest.raises(writing.ShippedFolderError, match="is a shipped folder"):
        sbj.save_drafter(*drafter, NEVER, format="speculators", target=target)
    with pytest.raises(writing.ShippedFolderError, match="is a shipped folder"):
        sbj.save_target(target, ASSETS / "_never_written_by_tests")
    relative = os.path.relpath(NEVER)  # as a user in the checkout would write it
    with pytest.raises(writing.ShippedFolderError):
        sbj.save_drafter(*drafter, relative)
    assert not NEVER.exists() and not (ASSETS / "_never_written_by_tests").exists()


def test_overwrite_and_the_trainers_permission_let_a_writer_replace_a_shipped_folder(
        shipped, tmp_path, monkeypatch):
    """Under a stand-in assets/ folder: overwrite=True (the API), --overwrite (the CLI) and
    `writing.replacing` (the trainer's overwrite=true around its task's export) write there."""
    target, drafter = shipped
    fake = tmp_path / "assets"
    monkeypatch.setattr(writing, "ASSETS", fake)
    out = fake / "drafters" / "mine"
    with pytest.raises(writing.ShippedFolderError):
        sbj.save_drafter(*drafter, out)
    sbj.save_drafter(*drafter, out, overwrite=True)
    with writing.replacing(out):
        sbj.save_drafter(*drafter, out)
    with pytest.raises(writing.ShippedFolderError):  # the permission ends with the block
        sbj.save_drafter(*drafter, out)
    assert export.main([str(ASSETS / "drafters" / "eagle3"), str(out), "--format", "eagle3",
                        "--target", str(ASSETS / "target"), "--overwrite"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


def test_the_trainers_refusal_is_the_shared_check(tmp_path):
    from specblock_jax.trainer.trainer import OutDirError, check_out_dir

    with pytest.raises(OutDirError, match="holds a shipped model under assets/"):
        check_out_dir(NEVER, tmp_path / "run", overwrite=False)
    assert issubclass(OutDirError, writing.ShippedFolderError)


def test_api_export_writes_the_clis_config_and_umask_modes(shipped, tmp_path, umask_022):
    """The README's `sbj.save_drafter(*drafter, "out", format="speculators", target=target)` and
    `specblock-export` of the same drafter write the same config.json: the target's position
    limit (not 1), its folder as the verifier (not "target") and its architectures; safetensors
    files get 0644 under umask 022, as the configs do."""
    target, drafter = shipped
    sbj.save_drafter(*drafter, tmp_path / "api", format="speculators", target=target)
    assert export.main([str(ASSETS / "drafters" / "eagle3"), str(tmp_path / "cli"), "--format", "speculators",
                        "--target", str(ASSETS / "target")]) == 0
    api = json.loads((tmp_path / "api" / "config.json").read_text())
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert api == cli
    assert api["transformer_layer_config"]["max_position_embeddings"] == target.config.max_position_embeddings == 2048
    assert api["speculators_config"]["verifier"] == {"name_or_path": str(ASSETS / "target"),
                                                     "architectures": ["Qwen3ForCausalLM"]}
    for folder in (tmp_path / "api", tmp_path / "cli"):
        assert {f.name: _mode(f) for f in folder.iterdir()} == {"config.json": 0o644, "model.safetensors": 0o644}
    by_path = tmp_path / "by_path"  # the target named by its folder: the same fields
    sbj.save_drafter(*drafter, by_path, format="speculators", target=ASSETS / "target")
    assert json.loads((by_path / "config.json").read_text()) == api


def test_engine_export_without_the_target_is_refused(shipped, tmp_path):
    target, drafter = shipped
    with pytest.raises(ValueError, match="records the target's position limit.*pass target="):
        sbj.save_drafter(*drafter, tmp_path / "x", format="speculators")
    assert not (tmp_path / "x").exists()
    nameless = target.replace(tokenizer=None)  # does not say where it was read from: name it
    sbj.save_drafter(*drafter, tmp_path / "y", format="speculators", target=nameless, verifier="Org/Model")
    verifier = json.loads((tmp_path / "y" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == "Org/Model"


def test_native_drafter_and_target_files_follow_the_umask(shipped, tmp_path, umask_022):
    target, drafter = shipped
    sbj.save_drafter(*drafter, tmp_path / "d")
    assert {f.name: _mode(f) for f in (tmp_path / "d").iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644, "draft_vocab.safetensors": 0o644}
    sbj.save_target(target, tmp_path / "t")
    assert all(_mode(f) == 0o644 for f in (tmp_path / "t").iterdir()), {
        f.name: oct(_mode(f)) for f in (tmp_path / "t").iterdir()}
    os.umask(0o077)
    sbj.save_drafter(*drafter, tmp_path / "private")
    assert _mode(tmp_path / "private" / "model.safetensors") == 0o600


def test_a_blockpilot_policy_file_follows_the_umask(tmp_path, umask_022):
    """save_blockpilot writes policy.safetensors itself (not through save_drafter): 0644 as its
    config.json, not safetensors' 0600."""
    from specblock_jax.drafters.blockpilot import PolicyConfig, init_policy, save_blockpilot

    policy = PolicyConfig(vocab_size=32, sizes=(4, 8), features="topk", top_k=4, width=8)
    _, params = init_policy(policy, 0)
    save_blockpilot(tmp_path / "bp", policy, params, "../dflash")
    assert {f.name: _mode(f) for f in (tmp_path / "bp").iterdir()} == {"config.json": 0o644,
                                                                        "policy.safetensors": 0o644}
