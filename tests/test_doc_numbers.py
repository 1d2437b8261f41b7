"""The figures the guides quote from benchmarks/RESULTS.md are the figures RESULTS.md shows.

For every link from README.md or docs/*.md to a section of benchmarks/RESULTS.md
(`[...](benchmarks/RESULTS.md#anchor)`, `[...](../benchmarks/RESULTS.md#anchor)`), the numbers of
the sentence that holds the link which carry a decimal point, a percent sign or an `x` ratio
(`50.6%`, `3.985`, `1.59x`, `2.1e-6`; not `1e-6` or `512`) must appear in the linked section (its
heading to the next heading of the same or a higher level, subsections included), thousands
separators aside; so must every figure of a line of RESULTS.md's own headline table in the
section it links to. A figure changed on one side only then fails here, naming the document,
line, number and section. Code spans and fenced blocks are not prose (a flag's value is not a
quoted figure).
"""
import glob
import os
import re

import pytest

from tests.test_doc_links import FENCE, LINK, anchor, prose

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "benchmarks/RESULTS.md"
DOCUMENTS = sorted(
    os.path.relpath(path, ROOT) for pattern in ("README.md", "docs/*.md")
    for path in glob.glob(os.path.join(ROOT, pattern)))
# A number as written in prose: digits with thousands separators, a decimal part, an exponent,
# then a percent sign or an `x` (a ratio). Version strings (5.24.0) are read whole and skipped.
NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)*(?:e[-+]?\d+)?)(%|x\b)?")
# A sentence ends at `.`, `!` or `?` before white space, at a blank line, and at the start of a
# list item, table row or heading.
SENTENCE_END = re.compile(r"[.!?](?=\s)|\n[ \t]*\n|\n(?=[ \t]*(?:[-*] |\d+\. |\||#))")


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def _plain(number: str) -> str:
  return re.sub(r"(?<=\d),(?=\d{3})", "", number)


def quoted_numbers(sentence: str):
  """The figures of a sentence: numbers with a decimal point, a percent sign or an `x` ratio,
  as written (thousands separators removed)."""
  found = []
  for match in NUMBER.finditer(sentence):
    digits, unit = match.group(1).rstrip(","), match.group(2) or ""
    if digits.count(".") > 1:   # a version, not a figure
      continue
    if "." in digits or unit:   # 1e-6 alone is a setting; 2.1e-6 a figure
      found.append(_plain(digits) + unit)
  return found


def sections(results_text: str) -> dict:
  """{anchor: text} of every heading of a results page, each text running to the next heading
  of the same or a higher level (duplicate headings numbered as GitHub numbers them)."""
  text = FENCE.sub(lambda m: m.group(0).replace("#", " "), results_text)   # no headings in code
  headings = [(m.start(), len(m.group(1)), m.group(2))
              for m in re.finditer(r"^(#{1,6})\s+(.*)$", text, re.M)]
  result, seen = {}, {}
  for i, (start, level, title) in enumerate(headings):
    end = next((s for s, lvl, _ in headings[i + 1:] if lvl <= level), len(results_text))
    base = anchor(title)
    name = f"{base}-{seen[base]}" if base in seen else base
    seen[base] = seen.get(base, 0) + 1
    result[name] = results_text[start:end]
  return result


def _as_figure(number: str) -> str:
  """A pattern of `number` as a whole figure: 1.5 is not in 11.5, 1.59 or 1.5.1."""
  return (r"(?<![\d.])" + re.escape(number) +
          (r"(?![\d])" if number[-1] in "%x" else r"(?![\d]|\.\d)"))


def appears(number: str, text: str) -> bool:
  """Whether `number` (as `quoted_numbers` gives it) is a figure of `text`."""
  return re.search(_as_figure(number), _plain(text)) is not None


def sentence_span(text: str, start: int, end: int):
  """(first, last) of the sentence of `text` that holds the span [start, end)."""
  before = [m.end() for m in SENTENCE_END.finditer(text, 0, start)]
  after = SENTENCE_END.search(text, end)
  return before[-1] if before else 0, after.start() if after else len(text)


def sentence_around(text: str, start: int, end: int) -> str:
  """The sentence of `text` that holds the span [start, end)."""
  first, last = sentence_span(text, start, end)
  return text[first:last]


def quotes(document: str, document_path: str):
  """(line, fragment, (first, last)) of each link of a document to a section of the results
  page, with the span of its sentence in `prose(document)`."""
  results = os.path.normpath(RESULTS)
  text = prose(document)
  for match in LINK.finditer(text):
    file_part, _, fragment = match.group(1).partition("#")
    target = os.path.normpath(os.path.join(os.path.dirname(document_path), file_part) if file_part
                              else document_path)
    if fragment and target == results:
      yield (text.count("\n", 0, match.start()) + 1, fragment,
             sentence_span(text, match.start(), match.end()))


def disagreements(document: str, document_path: str, results_text: str):
  """(line, number, anchor) of each figure a document quotes next to a link to a section of
  the results page that the section does not show; an anchor that names no section is
  reported with number None (test_doc_links names it too)."""
  by_anchor = sections(results_text)
  text = prose(document)
  found = []
  for line, fragment, (first, last) in quotes(document, document_path):
    if fragment not in by_anchor:
      found.append((line, None, fragment))
      continue
    for number in quoted_numbers(text[first:last]):
      if not appears(number, by_anchor[fragment]):
        found.append((line, number, fragment))
  return found


RESULTS_PAGE = ("## Speed\n\n### The step (2026-11-26)\n\nbert_jax **1,223.5 steps/s**, 50.6% MFU, "
                "**1.59x** the peer; parameters within 2.1e-6.\n\n## Other\n\n0.999x\n")


def test_the_extractor_reads_figures_not_versions_or_plain_integers():
  assert quoted_numbers("bert_jax 1,223.5 steps/s, 50.6% MFU and 1.59x the peer at 512 tokens, "
                        "transformers 5.24.0, within 2.1e-6, epsilon 1e-6, 8x the work") == [
                            "1223.5", "50.6%", "1.59x", "2.1e-6", "8x"]


def test_the_sentence_of_a_link_is_found():
  text = "First 1.0x. The step runs\n1.59x ([RESULTS](x.md#a)), see 2.0. Then 3.0x."
  start = text.index("[RESULTS]")
  assert sentence_around(text, start, start + 10) == (
      " The step runs\n1.59x ([RESULTS](x.md#a)), see 2.0")


def test_a_section_holds_its_subsections():
  page = sections(RESULTS_PAGE)
  assert "1.59x" in page["speed"] and "1.59x" in page["the-step-2026-11-26"]
  assert "0.999x" not in page["speed"]


def test_a_quoted_figure_agrees_with_its_section():
  doc = ("The step reaches 1,223.5 steps/s at 50.6% MFU, 1.59x the peer ([RESULTS](../benchmarks/"
         "RESULTS.md#the-step-2026-11-26)).\n")
  assert disagreements(doc, "docs/guide.md", RESULTS_PAGE) == []


def test_a_figure_changed_on_one_side_only_is_reported():
  doc = ("The step reaches 1,223.5 steps/s at 50.7% MFU, 1.6x the peer\n([RESULTS](../benchmarks/"
         "RESULTS.md#the-step-2026-11-26)), within 2.0e-6. Elsewhere 9.9x.\n")
  assert disagreements(doc, "docs/guide.md", RESULTS_PAGE) == [
      (2, "50.7%", "the-step-2026-11-26"), (2, "1.6x", "the-step-2026-11-26"),
      (2, "2.0e-6", "the-step-2026-11-26")]
  # From the front page the same link is written without `../`; 1.59 is not 0.59 or 1.5.
  doc = "0.59x and 1.5x, 1.59x and 1,223 ([results](benchmarks/RESULTS.md#speed))."
  assert disagreements(doc, "README.md", RESULTS_PAGE) == [
      (1, "0.59x", "speed"), (1, "1.5x", "speed")]
  # A figure in the section of another link is not this link's.
  doc = "1.59x ([results](benchmarks/RESULTS.md#other))."
  assert disagreements(doc, "README.md", RESULTS_PAGE) == [(1, "1.59x", "other")]


def test_a_headline_line_links_its_own_page():
  page = RESULTS_PAGE + "\n## Headline\n\n| [the step](#the-step-2026-11-26) | 1.59x | 1.6x |\n"
  assert disagreements(sections(page)["headline"], RESULTS, page) == [
      (3, "1.6x", "the-step-2026-11-26")]


def _other(number: str, text: str) -> str:
  """`number` with its last digit changed so that `text` does not show the result."""
  digits = [i for i, c in enumerate(number) if c.isdigit()]
  for step in range(1, 10):
    i = digits[-1]
    changed = number[:i] + str((int(number[i]) + step) % 10) + number[i + 1:]
    if not appears(changed, text):
      return changed
  raise AssertionError(number)


def test_a_real_quote_changed_on_either_side_is_reported():
  """Every figure the guides quote today: changed in the guide alone, or in RESULTS.md alone,
  the check names it."""
  results = _read(RESULTS)
  by_anchor = sections(results)
  cases = 0
  for path in DOCUMENTS:
    text = prose(_read(path))
    for line, fragment, (first, last) in quotes(text, path):
      sentence = text[first:last]
      for number in quoted_numbers(sentence):
        if number not in sentence:   # written with a thousands separator
          continue
        section = by_anchor[fragment]
        changed = _other(number, section)
        in_doc = text[:first] + re.sub(_as_figure(number), changed, sentence) + text[last:]
        assert (line, changed, fragment) in disagreements(in_doc, path, results)
        in_results = results.replace(section, re.sub(_as_figure(number), changed, _plain(section)))
        assert (line, number, fragment) in disagreements(text, path, in_results)
        cases += 1
  assert cases >= 5, cases   # 9 quoted on 2026-11-28 (the finished studies quoted from history)


def test_the_headline_figures_are_in_their_sections():
  page = _read(RESULTS)
  wrong = disagreements(sections(page)["headline-results"], RESULTS, page)
  assert not wrong, "\n".join(f"{RESULTS}, headline line {line}: {number} is not in #{fragment}"
                              for line, number, fragment in wrong)


@pytest.mark.parametrize("path", DOCUMENTS)
def test_figures_quoted_from_results_are_in_their_section(path):
  wrong = disagreements(_read(path), path, _read(RESULTS))
  assert not wrong, "\n".join(
      f"{path}:{line}: {number} is not in {RESULTS}#{fragment}" if number else
      f"{path}:{line}: no section #{fragment} in {RESULTS}" for line, number, fragment in wrong)



def test_results_figures_were_measured_inside_the_supported_jax_range():
  """Every `jax X.Y.Z` RESULTS.md names (the machine line of a figure) is inside setup.cfg's
  jax requirement (tests/test_doc_names.py pins the guides' install commands to it)."""
  from packaging.specifiers import SpecifierSet
  (spec,) = re.findall(r"^\s+jax(>=[\d.]+,<[\d.]+)\s*$", _read("setup.cfg"), re.M)
  measured = re.findall(r"\bjax (\d+\.\d+\.\d+)", _read(RESULTS))
  assert measured, f"{RESULTS} names no jax version"
  outside = sorted({v for v in measured if v not in SpecifierSet(spec)})
  assert not outside, f"{RESULTS}: figures measured with jax {outside}, outside setup.cfg's {spec}"
