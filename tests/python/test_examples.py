"""The scripts in examples/python run and succeed (torch's only where torch is installed)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def run(name):
    p = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_numpy_example():
    out = run("stage_numpy.py")
    assert "mxfp8" in out and "mxfp4" in out and "SNR" in out


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_example():
    assert "same bytes" in run("stage_torch.py")
