"""The product names concepts, not the build log: no "Day NN" or "Nth pass" in the package's code, comments, docstrings,
error messages or any `--help` (the notebooks' prose keeps its days). And no line of the package over 120 characters
but the two nbdev generates (the module docstring, the first line of `__all__`); the other rules are ruff's
(`make lint`)."""
import contextlib, io, re
from pathlib import Path
import pytest
import nanoserve
from nanoserve.cli import build_parser

LOG = re.compile(r"\bDay \d+|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
                 r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(st|nd|rd|th))"
                 r" pass\b", re.IGNORECASE)
MODULES = sorted(p for p in Path(nanoserve.__file__).parent.glob('*.py') if p.name != '_modidx.py')

def test_the_pattern_finds_what_it_should():
    hits = [s for s in ("as Day 56 found", "the tenth pass", "the 3rd pass", "a passing test", "Days of", "bypass")
            if LOG.search(s)]
    assert hits == ["as Day 56 found", "the tenth pass", "the 3rd pass"]

@pytest.mark.parametrize('path', MODULES, ids=lambda p: p.name)
def test_no_build_log_in_the_package(path):
    found = [f"{path.name}:{i}: {line.strip()[:100]}" for i, line in enumerate(path.read_text().splitlines(), 1)
             if LOG.search(line)]
    assert not found, "name the concept, not the day or pass that built it:\n" + '\n'.join(found)

def help_of(argv: tuple = ()) -> str:
    "What `nanoserve *argv --help` prints, through the parser's public interface."
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit): build_parser().parse_args([*argv, '--help'])
    return out.getvalue()

def helps(argv: tuple = ()):
    "Every command's --help text: the subcommands are the lines its help lists under its positional argument."
    text = help_of(argv)
    yield ' '.join(['nanoserve', *argv]), text
    for sub in re.findall(r'^    ([a-z][\w-]*)(?:\s|$)', text, re.M): yield from helps((*argv, sub))

def test_no_build_log_in_help():
    texts = dict(helps())
    assert {'nanoserve serve', 'nanoserve bench offline', 'nanoserve generate'} <= set(texts)
    found = [f"{name}: {line.strip()}" for name, text in texts.items()
             for line in text.splitlines() if LOG.search(line)]
    assert not found, '\n'.join(found)

def generated(lines: list[str], i: int) -> bool:
    "Line `i` is nbdev's: the module docstring it makes from the notebook's summary, or the first line of `__all__`."
    return i == 0 and lines[0].startswith('"""') or lines[i].startswith('__all__ = [')

@pytest.mark.parametrize('path', MODULES, ids=lambda p: p.name)
def test_lines_within_120_characters(path):
    lines = path.read_text().splitlines()
    long = [f"{path.name}:{i + 1}: {len(s)} characters" for i, s in enumerate(lines)
            if len(s) > 120 and not generated(lines, i)]
    assert not long, '\n'.join(long)
