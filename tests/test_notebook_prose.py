"""What the notebooks' prose states holds for any run: a figure in markdown is a constant (a
default, a documented limit, a cloud fact), listed below with what it is; a figure of the run is
printed by a code cell from the run's own data. The executed notebooks' printed figures are
checked against their results in tests/test_notebooks.py."""

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
UNIT = (r"(?:s|ms|µs|seconds?|minutes?|min|hours?|h|%|k|x|env steps|steps|updates|transitions"
        r"|episodes|GB|GiB|MiB)\b")
FIGURE = re.compile(r"(?<![\w.`/=$-])(?:about |around |~)?\d[\d,.]*(?:\s*[-–]\s*\d[\d,.]*)?\s*"
                    + UNIT)

# Figures that are not a run's: (notebook, figure) -> what it is.
CONSTANTS = {
    ("01", "2 GB"): "what the notebook needs, a requirement",
    ("01", "27,000 steps"): "where a greedy evaluation ends (rl.envs.EVAL_MAX_STEPS)",
    ("01", "26 s"): "the copy's defaults to a held-out 200 on LunarLander-v3, seed 0 "
                    "(benchmarks/results/copy_path.txt)",
    ("01", "34 s"): "the same, seed 1 (benchmarks/results/copy_path.txt)",
    ("03", "about 30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("03", "15 s"): "the part of that notice GKE gives non-system Pods (GKE docs; SPOT_GRACE_S)",
    ("03", "10 minutes"): "how long the autoscaler keeps an unneeded node by default "
                          "(kubernetes/autoscaler's FAQ; settings.NODE_UNNEEDED_S)",
    ("04", "about 30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("04", "50 updates"): "updates between two checks of a hold (apex.hold.CHECK_EVERY)",
}


def prose_figures() -> dict[tuple[str, str], list[str]]:
    """(notebook number, figure) -> where it stands, for every figure in the notebooks'
    markdown outside code spans and the generated listings."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "markdown" or any(
                    t.startswith("generated:") for t in cell["metadata"].get("tags", [])):
                continue
            text = re.sub(r"```.*?```", "", "".join(cell["source"]), flags=re.S)
            text = re.sub(r"`[^`]*`", "", text)
            for match in FIGURE.finditer(text):
                context = text[max(0, match.start() - 60):match.end() + 30].replace("\n", " ")
                found.setdefault((path.name[:2], match.group(0)), []).append(
                    f"{path.name} cell {i}: ...{context}...")
    return found


def test_every_figure_in_the_notebooks_prose_is_a_constant_not_a_run_figure():
    found = prose_figures()
    unexplained = {key: where for key, where in found.items() if key not in CONSTANTS}
    assert not unexplained, (
        "a figure in prose: print it from the run in a code cell (or word it for any run); if "
        "it is a constant, add it to CONSTANTS with what it is:\n"
        + "\n".join(f"{key}: {where[0]}" for key, where in unexplained.items()))
    stale = sorted(set(CONSTANTS) - set(found))
    assert not stale, f"CONSTANTS lists figures no notebook states any more: {stale}"


def test_the_lint_catches_the_stale_figures_it_was_written_for():
    for text in ("the full run (about 4 minutes on 2 cores)", "from 390 to 110 at 60-70 s",
                 "64 env steps per update", "noticed in about 15-30 s", "rose to 10.3 k"):
        assert FIGURE.search(text), text
    for text in ("`MAX_SECONDS`", "notebook 05", "Python 3.11", "a 64x64 network"):
        assert not FIGURE.search(re.sub(r"`[^`]*`", "", text)), text


def _notebook_code(number: str) -> str:
    path = next(NOTEBOOKS.glob(f"{number}-*.ipynb"))
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "code")


def test_the_constants_the_prose_states_are_what_the_code_uses():
    """A constant the prose states that the code defines is the code's value, so a changed
    default cannot leave the prose behind. (Cloud facts and requirements have no code value.)"""
    from distrl.gke import manifests
    from distrl.rl import envs

    stated = {  # (notebook, figure) -> (the code's value, the figure's value), in one unit
        ("01", "27,000 steps"): (envs.EVAL_MAX_STEPS, 27_000),
        ("03", "15 s"): (manifests.SPOT_GRACE_S, 15),
    }
    assert set(stated) <= set(CONSTANTS)
    wrong = {key: values for key, values in stated.items() if values[0] != values[1]}
    assert not wrong, f"the prose states these figures, the code has other values: {wrong}"


# A reader's budget for the series (issue 50), measured as ../shared/tools/prose_stats.py does:
# prose is markdown outside code spans, fences, table and list markers and generated listings.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*`\"'])")


def _prose(text: str) -> str:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "X", text)
    return re.sub(r"^\s*[#>|-].*?(?=\S)", "", text, flags=re.M)


def test_the_series_reads_within_a_readers_budget():
    """At most 8,000 words of prose, sentences of at most 20 words on average, and markdown
    cells of at most 60 words in the median and 150 at most: one idea a cell."""
    words, sentences, cells = 0, [], []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            first = source.lstrip().splitlines()[0] if source.strip() else ""
            if cell["cell_type"] != "markdown" or (first.startswith("<!--")
                                                   and "generated" in first.lower()):
                continue
            n = len(_prose(source).split())
            words += n
            cells.append((n, f"{path.name} cell {i}"))
            for paragraph in re.split(r"\n\s*\n", _prose(source)):
                sentences += [len(s.split()) for s in SENTENCE_END.split(" ".join(paragraph.split()))
                              if len(s.split()) >= 3]
    assert words <= 8000, words
    assert sum(sentences) / len(sentences) <= 20, sum(sentences) / len(sentences)
    sizes = sorted(n for n, _ in cells)
    assert sizes[len(sizes) // 2] <= 60, sizes[len(sizes) // 2]
    assert max(cells)[0] <= 150, max(cells)
