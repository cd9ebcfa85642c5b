"""Every command in the README's shell blocks works as typed, in a fresh checkout, once `.venv`
is active (`source .venv/bin/activate`, the line after the two commands).

Each command runs as typed, or in its cheap form: a Snakemake run as its dry run (`-n`), a
make target with `make -n`, `dvc repro` as `dvc status` (DVC's own dry run stops at the first
stage whose inputs an earlier stage has not made yet, which in a fresh checkout is the second),
and `dvc exp run -S file:key=value` as that change applied to the file and checked as the
workflow checks a config (schema and cross-key rules). An episode table that
`coordgap show` reads is made first when it is cheap (a scripted model's cell). A command
that needs what a test cannot have (a remote's storage, a finished run's outputs) is only
resolved: its executable must be on the venv's PATH and its subcommand must answer `--help`.
A command of a tool this file does not know fails the test, so a new kind of command in the
README needs a rule here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import check_schema
from tests.conftest import ROOT, tool_env

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

README = ROOT / "README.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# What the commands of a block are separated by.
SEPARATORS = {";", "&&"}
# dvc subcommands that need a remote's storage or a finished run's outputs.
DVC_RESOLVE_ONLY = {
    "push": "needs the remote's storage",
    "pull": "needs the remote's storage",
    "metrics": "reads results/metrics, which `make all` writes",
    "plots": "reads the statistics tables, which `make all` writes",
}
# Models whose cells are cheap enough to play for `coordgap show` (scripted policies).
CHEAP_MODELS = {"resource_hierarchy", "left_first", "random", "think_only", "silent"}


def readme_commands(text: str) -> list[list[str]]:
    """The commands of the bash blocks of ``text``, each as its words: lines continued with a
    backslash are joined, comments dropped, and ``a; b`` and ``a && b`` are two commands."""
    commands = []
    for block in BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&")
            lexer.whitespace_split = True
            command: list[str] = []
            for word in [*lexer, ";"]:
                if word in SEPARATORS:
                    if command:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


def cheap_form(command: list[str]) -> tuple[list[str] | None, str]:
    """How a test runs ``command``: its cheap form, or None and why it is only resolved.

    Raises:
        AssertionError: A tool this file has no rule for.
    """
    tool, *args = command
    if tool == "make":
        return ["make", "-n", *args], "make's dry run: the targets exist"
    if tool == "snakemake":
        if {"--lint", "--unlock"} & set(args) or "-n" in args:
            return command, "as typed"
        return [*command, "-n"], "its dry run"
    if tool == "coordgap":
        return command, "as typed"
    if tool == "dvc":
        if args[0] in DVC_RESOLVE_ONLY:
            return None, DVC_RESOLVE_ONLY[args[0]]
        if args[0] == "repro":
            return ["dvc", "status"], "the stages, their deps and params resolve"
        if args[:2] == ["exp", "run"]:
            return None, "its -S changes are applied to the params file and checked"
        return command, "as typed"
    if tool == "cp":
        return None, "edits the checkout (its source must exist)"
    if tool == "source":
        return None, "activates the venv this test runs in"
    if tool == "tensorboard":
        return None, "serves the tracking store until stopped"
    raise AssertionError(f"the README runs {tool!r}: say in {__name__} how to check it")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A fresh checkout of the working tree: its tracked and unignored files, one commit."""
    dest = tmp_path_factory.mktemp("checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    identity = ["-c", "user.name=readme", "-c", "user.email=readme@localhost"]
    for git in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "-m", "fresh"]):
        subprocess.run(["git", *git], cwd=dest, check=True, capture_output=True)
    return dest


def _shell(checkout: Path, words: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", shlex.join(words)],
        cwd=checkout,
        env=tool_env() | {"VIRTUAL_ENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _table_first(checkout: Path, command: list[str]) -> None:
    """Make the episode table a ``coordgap show`` reads, or dry-run it where it is not cheap."""
    if command[1] != "show":
        return
    table = command[2]
    model = Path(table).parent.name
    build = ["snakemake", table, "--cores", "1"] + ([] if model in CHEAP_MODELS else ["-n"])
    result = _shell(checkout, build)
    assert result.returncode == 0, f"{build} failed:\n{result.stdout}\n{result.stderr}"
    if model not in CHEAP_MODELS:
        pytest.skip(f"{table} is a language model's cell; its target dry-runs")


def _check_set_params(checkout: Path, command: list[str]) -> None:
    """Apply each ``-S file:key=value`` of a ``dvc exp run`` to its file and check the result:
    every key must exist already (a misspelt one would add a key no stage reads)."""
    changes = [command[k + 1] for k, word in enumerate(command) if word == "-S"]
    assert changes, command
    for change in changes:
        file, _, setting = change.partition(":")
        dotted, _, value = setting.partition("=")
        config = yaml.safe_load((checkout / file).read_text(encoding="utf-8"))
        *parents, leaf = dotted.split(".")
        node = config
        for key in parents:
            node = node[key]
        assert leaf in node, f"{change}: {file} has no key {dotted}"
        node[leaf] = yaml.safe_load(value)
        check_schema(config)
        check_cross_keys(config)


def test_the_readme_shows_commands():
    commands = readme_commands(README.read_text(encoding="utf-8"))
    tools = {command[0] for command in commands}
    assert {"make", "snakemake", "coordgap", "dvc", "source"} <= tools
    assert ["source", ".venv/bin/activate"] in commands


def test_commands_are_split_as_a_shell_would():
    text = "```bash\ndvc metrics show; dvc plots show   # both\nsnakemake a \\\n  -n\n```\n"
    assert readme_commands(text) == [
        ["dvc", "metrics", "show"],
        ["dvc", "plots", "show"],
        ["snakemake", "a", "-n"],
    ]


def test_no_readme_command_puts_a_target_after_configfile():
    """Snakemake reads every word after --configfile as a file: a target must come first."""
    for command in readme_commands(README.read_text(encoding="utf-8")):
        if command[0] in {"snakemake", "coordgap"} and "--configfile" in command:
            after = command[command.index("--configfile") + 1 :]
            files = after[: next((k for k, w in enumerate(after) if w.startswith("-")), None)]
            assert files, command
            assert all(Path(word).suffix == ".yaml" for word in files), command


@pytest.mark.parametrize(
    "command",
    readme_commands(README.read_text(encoding="utf-8")),
    ids=lambda command: shlex.join(command)[:80],
)
def test_readme_command_runs_as_typed(checkout, command):
    path = tool_env()["PATH"]
    assert shutil.which(command[0], path=path) or command[0] == "source", (
        f"{command[0]}: command not found with .venv active"
    )
    runnable, why = cheap_form(command)
    if runnable is None:
        if command[0] == "cp":
            assert (checkout / command[1]).exists(), f"{command}: no {command[1]}"
        elif command[0] == "source":
            assert (Path(sys.prefix) / "bin" / "activate").is_file()
        elif command[:3] == ["dvc", "exp", "run"]:
            _check_set_params(checkout, command)
        else:
            # dvc's subcommand answers --help itself; a server's executable does.
            subcommand = command[:2] if command[0] == "dvc" else command[:1]
            result = _shell(checkout, [*subcommand, "--help"])
            assert result.returncode == 0, f"{subcommand} --help: {result.stderr}"
        return
    _table_first(checkout, command)
    result = _shell(checkout, runnable)
    assert result.returncode == 0, (
        f"{shlex.join(command)} ({why}: {shlex.join(runnable)}) failed "
        f"({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
