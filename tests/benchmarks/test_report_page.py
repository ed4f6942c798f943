"""Re-rendering RESULTS.md replaces only the steady-state section between its two markers."""

from __future__ import annotations

from pathlib import Path

from benchmarks import report

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"


def test_the_hand_written_head_and_tail_are_kept() -> None:
    existing = RESULTS.read_text()
    head, tail = report.kept_head(existing), report.kept_sections(existing)
    assert "| question | headline | section |" in head and "## On a GPU" in tail
    page = head + "## S3 at +50 ms vs local disk, steady state\n\n(rendered)\n" + tail
    assert report.kept_head(page) == head and report.kept_sections(page) == tail


def test_a_page_without_markers_gets_a_title() -> None:
    assert report.kept_head("").startswith("# Benchmark results")
    assert report.kept_sections("") == ""
