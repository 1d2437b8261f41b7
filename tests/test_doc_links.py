"""The documents' relative links resolve, and the commands they give name modules that exist.

Every `[text](target)` in README.md, WORKSPACE.md, docs/ and benchmarks/ (results and history)
that is not a URL must name a file or folder of the repository, and its `#anchor`, if any, a
heading of that file (GitHub's rule for heading anchors). Every `python -m benchmarks.NAME` must
name a module in benchmarks/ (in benchmarks/history/, a study whose code left the tree: the commit
it lived at, `git show COMMIT:benchmarks/NAME.py`, in a history file), and no document may still
run a benchmark as a script path.
"""
import collections
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = sorted(
    os.path.relpath(path, ROOT) for pattern in ("README.md", "WORKSPACE.md", "docs/*.md",
                                                "benchmarks/*.md", "benchmarks/history/*.md")
    for path in glob.glob(os.path.join(ROOT, pattern)))
# Link text and code spans may wrap lines, but not cross a paragraph (a blank line).
IN_PARAGRAPH = r"(?:[^{end}\n]|\n(?![ \t]*\n))*"
LINK = re.compile(r"!?\[" + IN_PARAGRAPH.format(end=r"\]") + r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile("`" + IN_PARAGRAPH.format(end="`") + "`")


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set:
  seen = collections.Counter()
  result = set()
  for line in FENCE.sub("", _read(path)).splitlines():
    match = re.match(r"#{1,6}\s+(.*)", line)
    if match:
      base = anchor(match.group(1))
      result.add(base if not seen[base] else f"{base}-{seen[base]}")
      seen[base] += 1
  return result


def prose(text: str) -> str:
  """The text without fenced blocks and code spans, each blanked to its line breaks so that
  line numbers stay those of the file."""
  blank = lambda match: "\n" * match.group(0).count("\n")
  return CODE_SPAN.sub(blank, FENCE.sub(blank, text))


def links_in(text: str):
  """(line, target) of every relative link of a document's text, its text wrapped or not."""
  text = prose(text)
  for match in LINK.finditer(text):
    target = match.group(1)
    if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
      yield text.count("\n", 0, match.start()) + 1, target


def links(path: str):
  return links_in(_read(path))


def test_the_documents_are_there():
  assert {"README.md", "WORKSPACE.md", "benchmarks/RESULTS.md"} <= set(DOCUMENTS)
  assert any(path.startswith("docs/") for path in DOCUMENTS)


def test_anchor_follows_github():
  assert anchor("The TPU step: where the bytes go (2026-11-25)") == (
      "the-tpu-step-where-the-bytes-go-2026-11-25")
  assert anchor("What `compile_report.json` holds") == "what-compile_reportjson-holds"


def test_a_link_whose_text_wraps_a_line_is_found():
  text = ("Intro\n\n```\n[fenced](no.md)\n```\nSee [the guide\nto TPUs](docs/tpu.md#x) and `[code\n"
          "span](no.md)`, [one](a.md).\n\n[not a link\n\nacross paragraphs](no.md)\n")
  assert list(links_in(text)) == [(6, "docs/tpu.md#x"), (8, "a.md")]


@pytest.mark.parametrize("path", DOCUMENTS)
def test_relative_links_resolve(path):
  broken = []
  for number, target in links(path):
    file_part, _, fragment = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
        else path
    if not os.path.exists(os.path.join(ROOT, resolved)):
      broken.append(f"{path}:{number}: {target} (no file {resolved})")
    elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
      broken.append(f"{path}:{number}: {target} (no heading #{fragment} in {resolved})")
  assert not broken, "\n".join(broken)


def retired_benchmarks() -> set:
  """The benchmark files whose code left the tree: a history file gives the commit it lived at
  (`git show COMMIT:benchmarks/NAME.py`, or a file of the package `benchmarks/NAME/`: a part of
  a benchmark may leave while the rest stays)."""
  return {file for path in DOCUMENTS if path.startswith("benchmarks/history/")
          for file in re.findall(r"git show [0-9a-f]{7,40}:(benchmarks/[a-z_]+(?:/[a-z_]+)?\.py)",
                                 _read(path))}


@pytest.mark.parametrize("path", DOCUMENTS)
def test_benchmark_commands_name_modules(path):
  text = _read(path)
  assert not re.findall(r"python benchmarks/\w+\.py", text), (
      f"{path}: run benchmarks as `python -m benchmarks.NAME` from the repository root")
  retired = retired_benchmarks() if path.startswith("benchmarks/history/") else set()
  for name in re.findall(r"python -m benchmarks\.([a-z_]+)", text):
    module = os.path.join(ROOT, "benchmarks", name)
    assert (os.path.exists(module + ".py") or os.path.exists(os.path.join(module, "__main__.py"))
            or any(p == f"benchmarks/{name}.py" or p.startswith(f"benchmarks/{name}/")
                   for p in retired)), (
        f"{path}: python -m benchmarks.{name}: no such module (a study whose code left the tree: "
        "give `git show COMMIT:benchmarks/NAME.py` in its history file)")


def test_a_retired_benchmark_is_one_a_history_file_gives_the_commit_of():
  retired = retired_benchmarks()
  assert {"benchmarks/modern_growth.py", "benchmarks/time_to_quality/hf_side.py"} <= retired
  assert not any(os.path.exists(os.path.join(ROOT, path)) for path in retired)
