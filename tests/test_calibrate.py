"""Tree-shape calibration (serving/calibrate.py) of drafter kinds beyond EAGLE-3 (whose grid is
tested in tests/test_eagle3.py)."""

from __future__ import annotations

import jax
import pytest

from helpers import peaked_tiny_target
from specblock_jax.serving.calibrate import calibrate, check_grid, default_grid, settings, with_setting
from specblock_jax.decoding.compiled import cached_count
from specblock_jax.drafters.dflash._train import DFlashTask
from specblock_jax.drafters.prompt_lookup._model import PromptLookup


def test_grids_per_kind():
    assert default_grid(PromptLookup(num_nodes=6)) == {"num_nodes": (4, 6, 8, 16)}  # defaults + its own
    assert settings({"num_nodes": (8, 16), "max_blocks": (2, 3)}) == [
        {"num_nodes": 8, "max_blocks": 2}, {"num_nodes": 8, "max_blocks": 3},
        {"num_nodes": 16, "max_blocks": 2}, {"num_nodes": 16, "max_blocks": 3}]
    with pytest.raises(ValueError, match="knobs are"):
        check_grid(PromptLookup(), {"depth": (3,)})


def test_calibrate_picks_the_fastest_dflash_block_size():
    target = peaked_tiny_target(8)
    task = DFlashTask({"num_layers": 1, "block_size": 4, "num_anchors": 2, "mask_token_id": 3}, target)
    bundle = task.decoding_drafter(task.init_params(jax.random.key(1)))
    drafter = bundle[0]
    assert default_grid(drafter) == {"block_size": (4,)}  # the defaults above 4 exceed its training
    with pytest.raises(ValueError, match=r"block_size must be in \[2, 4\]"):
        check_grid(drafter, {"block_size": (2, 8)})
    held = cached_count()
    out = calibrate(target, bundle, [[1, 2, 3], [4, 5, 6, 7]], {"block_size": (2, 4)}, max_new_tokens=10,
                    batch_size=2, verify_timing=False)
    assert cached_count() == held  # the candidates' executables are released (XLA:CPU code memory)
    assert out["kind"] == "dflash" and [r["block_size"] for r in out["table"]] == [2, 4]
    best = max(out["table"], key=lambda r: r["tokens_per_s"])
    assert out["best"] == {"block_size": best["block_size"]} and out["calibrate_s"] > 0
    assert out["verify_ms"] == {}  # timed in tests/test_eagle3.py's calibration test
    assert with_setting(bundle, {"block_size": 2})[0].num_nodes == 2
