"""The house's size goals (DESIGN §3 "a file is a concept"; §2 "no folder holds more than about a fifth
of the code"), measured the way import-linter measures the layers, so that a merge that outgrows them
fails here rather than in a review a day later. No exceptions list: a file past the limit is split
along a seam of its own concepts, not excused."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "glassrl"
MAX_FILE_LINES = 600
MAX_FOLDER_SHARE = 0.20


def source_lines(root: Path = SRC) -> dict[str, int]:
    """Every Python file under ``root``, as a relative POSIX path -> its line count."""
    return {
        path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }


def oversized(lines: dict[str, int]) -> list[str]:
    """The files past MAX_FILE_LINES, named with their counts."""
    return [f"{path}: {n} lines" for path, n in lines.items() if n > MAX_FILE_LINES]


def overfull(lines: dict[str, int]) -> list[str]:
    """The top-level folders holding more than MAX_FOLDER_SHARE of all lines, named with their shares.
    Base modules (config.py, cli.py, …) belong to no folder but count in the total."""
    total = sum(lines.values())
    folders: dict[str, int] = {}
    for path, n in lines.items():
        if "/" in path:
            folder = path.split("/", 1)[0]
            folders[folder] = folders.get(folder, 0) + n
    return [f"{name}/: {n / total:.1%}" for name, n in sorted(folders.items()) if n > MAX_FOLDER_SHARE * total]


def test_no_source_file_passes_600_lines():
    too_long = oversized(source_lines())
    assert not too_long, f"past {MAX_FILE_LINES} lines (find the second concept inside): " + "; ".join(too_long)


def test_no_top_level_folder_holds_more_than_a_fifth_of_the_source():
    lines = source_lines()
    over = overfull(lines)
    assert not over, f"past {MAX_FOLDER_SHARE:.0%} of {sum(lines.values())} source lines: " + "; ".join(over)


def test_the_measures_name_what_passes_and_read_the_whole_tree(tmp_path):
    """Controls: each measure names an offender it is shown, and the count reads real files."""
    assert oversized({"a/x.py": 601, "a/y.py": 600}) == ["a/x.py: 601 lines"]
    assert overfull({"a/x.py": 21, "b/y.py": 20, "c/z.py": 20, "d/w.py": 20, "cli.py": 19}) == ["a/: 21.0%"]
    assert overfull({"a/x.py": 20, "b/y.py": 20, "c/z.py": 20, "d/w.py": 20, "cli.py": 20}) == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("a = 1\nb = 2\n", encoding="utf-8")
    assert source_lines(tmp_path) == {"pkg/m.py": 2}
    lines = source_lines()
    assert "algos/masked.py" in lines and len(lines) > 100 and sum(lines.values()) > 20_000
