"""bench/perfdoc.py (tables and docs splice of the side-by-side benchmark), on the H200
results committed in bench/results: no torch, no GPU."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _perfdoc():
    spec = importlib.util.spec_from_file_location("perfdoc", ROOT / "bench" / "perfdoc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _named_results_path() -> pathlib.Path:
    doc = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    named = re.search(r"bench/perfdoc\.py (bench/results/\S+\.json)", doc)
    assert named, "PERFORMANCE.md must name the JSON its tables come from"
    return ROOT / named.group(1)


def _results():
    return json.loads(_named_results_path().read_text())


def test_markdown_has_one_row_per_result():
    pd, res = _perfdoc(), _results()
    md = pd.markdown(res)
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| T ")]
    assert len(rows) == len(res["rows"]) == 36
    first = res["rows"][0]
    assert f"| {first['T']} | {first['bytes'] / 1e6:.2f} MB | {first['megamoe_us']:.2f} |" in md
    assert "NO" not in md  # every committed row was bit-exact


def test_splice_replaces_only_between_markers_and_is_idempotent():
    pd = _perfdoc()
    doc = f"intro\n{pd.BEGIN}\nold table\n{pd.END}\noutro\n"
    once = pd.splice(doc, "| new |\n")
    assert once.startswith("intro\n" + pd.BEGIN) and once.endswith(pd.END + "\noutro\n")
    assert "old table" not in once and "| new |" in once
    assert pd.splice(once, "| new |\n") == once
    with pytest.raises(ValueError, match="markers"):
        pd.splice("no markers here", "x")


def test_performance_doc_tables_match_the_results_it_names():
    pd = _perfdoc()
    doc = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    res = json.loads(_named_results_path().read_text())
    assert pd.splice(doc, pd.markdown(res)) == doc
