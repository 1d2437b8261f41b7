"""README's two first commands are what CI runs: its set-up (the first command up to the demo
run) and its test command appear in .ci/run verbatim, and .ci/run installs nothing else, so CI
tests the environment a user's `pip install` gives (the default torch build with Triton)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
  blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
  return blocks[0].strip(), blocks[1].strip()


def _ci_lines():
  return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]


def test_readme_set_up_and_tests_are_what_ci_runs():
  main_job, tests = _readme_commands()
  set_up, _, demo = main_job.partition(" && python -m bert_jax.main ")
  assert demo.startswith("--config=experiments/pretrain_demo.py"), main_job
  lines = _ci_lines()
  assert set_up in lines, (set_up, lines)
  assert tests in lines, (tests, lines)
  assert lines.index(set_up) < lines.index(tests)


def test_ci_installs_only_what_readme_installs():
  main_job, tests = _readme_commands()
  readme = {part.strip() for command in (main_job, tests) for part in command.split("&&")}
  installs = [part.strip() for line in _ci_lines() for part in line.split("&&")
              if "pip install" in part]
  assert installs and all(part in readme for part in installs), installs
