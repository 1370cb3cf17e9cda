"""examples/random_ltd_gpt/train.py, short: two DDP workers train the GPT
with tokensel's RandomLayerTokenDrop and with the pure-PyTorch reference on
the same ids; losses and final weights must be identical bit for bit, the
recomputed forwards must see the forwards' ids, and the steady state must
stage nothing inline (the full run: README.md, "Training with PyTorch")."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'tokensel[torch]')")
from conftest import server_binary  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "random_ltd_gpt" / "train.py"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="not run from a checkout (no examples/)")
def test_two_runs_are_identical(tmp_path):
    argv = [sys.executable, str(EXAMPLE), "--steps", "6", "--batch", "4", "--seq", "32",
            "--d-model", "64", "--min-tokens", "8", "--max-tokens", "24", "--seq-per-step", "4",
            "--require-steps", "3", "--out-dir", str(tmp_path), "--server-binary", server_binary()]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["losses_identical"] and summary["weights_identical"], out
    assert summary["ids_identical"] and summary["recompute_checks"] > 0, out
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["steady_inline_bytes_per_step"] == {"sent": 0, "received": 0}, out
    assert summary["steady_arena_allocations"] == 0, out
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "loss.png").stat().st_size > 0
