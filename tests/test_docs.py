"""Every code block in README.md and docs/ runs as written.

A document is followed the way a reader follows it: its blocks run in order, in a fresh directory
that holds the clone's `examples/` (the README's paths are relative to a clone), `python` blocks in
one namespace (as in one interpreter session) and `sh` blocks in bash with `set -e` and the venv's
`simnet` on PATH. `toml` blocks must parse. `text` blocks are output or layout and do not run. A
block in any other language, or without one, fails the test: nothing is silently skipped.

Two kinds of shell lines are covered by other tests, named in `COVERED_ELSEWHERE`; the test checks
that those tests exist. The one change made to what a document says: each loopback port it names
(127.0.0.1:7070) becomes a free one, so documents and other tests can run side by side. Servers a
document leaves running are stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN, PARSE, SHOWN = {"python", "sh"}, {"toml"}, {"text"}
PORT = re.compile(r"127\.0\.0\.1:(\d{4,5})\b")
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
COVERED_ELSEWHERE = {  # a shell line that starts so -> the test that runs what it does
    "python3 dev.py demo": "tests/test_examples.py::test_fleet_demo",
    "python3 dev.py test": "tests/test_docs.py::test_ci_runs_the_readme_test_command",
}
TIMEOUT_S = 600
_RESERVED: list[socket.socket] = []


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    text = document.read_text()
    return [
        Block(document, text.count("\n", 0, m.start()) + 1, m["lang"].strip(), m["code"])
        for m in FENCE.finditer(text)
    ]


def runnable(document: Path) -> list[Block]:
    return [b for b in blocks(document) if b.lang in RUN and _uncovered(b.code).strip()]


def _uncovered(code: str) -> str:
    return "\n".join(
        line for line in code.splitlines() if not line.strip().startswith(tuple(COVERED_ELSEWHERE))
    )


# The driver runs in a child process: the blocks' own cwd, environment and background servers stay
# out of pytest's process. It reports the block that failed on its last line.
DRIVER = textwrap.dedent(
    """
    import json, subprocess, sys, time, traceback

    def main():
        namespace = {"__name__": "__main__"}
        for block in json.load(open(sys.argv[1])):
            print(f"--- {block['where']} ({block['lang']})", flush=True)
            start = time.monotonic()
            try:
                if block["lang"] == "python":
                    exec(compile(block["code"], block["where"], "exec"), namespace)
                else:
                    cmd = ["bash", "-e", "-o", "pipefail", "-c", block["code"]]
                    subprocess.run(cmd, check=True)
            except BaseException:
                traceback.print_exc()
                sys.stdout.flush()
                print(f"FAILED AT {block['where']}", file=sys.stderr)
                sys.exit(1)
            print(f"--- {block['where']} took {time.monotonic() - start:.1f} s", flush=True)

    if __name__ == "__main__":  # worker processes a block starts import this file again
        main()
    """
)


@pytest.mark.parametrize(
    "document",
    [d for d in DOCUMENTS if runnable(d)],
    ids=lambda d: str(d.relative_to(ROOT)),
)
def test_document_runs_as_written(document, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / ".blocks.json"
    ports: dict[str, str] = {}
    steps = [
        {"where": b.where, "lang": b.lang, "code": _free_ports(_uncovered(b.code), ports)}
        for b in runnable(document)
    ]
    script.write_text(json.dumps(steps))
    (tmp_path / ".driver.py").write_text(DRIVER)
    bin_dir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),  # the code under test, also from a worktree
        MPLBACKEND="Agg",
    )
    try:
        result = subprocess.run(
            [sys.executable, ".driver.py", str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        _stop_servers(tmp_path)
    assert result.returncode == 0, (result.stdout[-6000:], result.stderr[-6000:])


def _free_ports(code: str, ports: dict[str, str]) -> str:
    """`code` with each loopback port replaced by a free one (the same one wherever it recurs)."""

    def free(match: re.Match[str]) -> str:
        if match[1] not in ports:
            sock = socket.socket()  # kept bound, never listening: nothing else takes the port,
            sock.bind(("127.0.0.1", 0))  # while `simnet serve` (SO_REUSEADDR) binds it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _RESERVED.append(sock)
            ports[match[1]] = str(sock.getsockname()[1])
        return f"127.0.0.1:{ports[match[1]]}"

    return PORT.sub(free, code)


def _stop_servers(folder: Path) -> None:
    """`simnet serve --detach` servers a document left running (each in its own session)."""
    for served in folder.rglob("serve.json"):
        try:
            os.kill(json.loads(served.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_block_names_a_language_the_suite_handles(document):
    for block in blocks(document):
        assert block.lang in RUN | PARSE | SHOWN, (
            f"{block.where}: a ```{block.lang} block; use python or sh (run), toml (parsed) or "
            "text (output, not run)"
        )
        if block.lang == "toml":
            tomllib.loads(block.code)


def test_lines_covered_elsewhere_name_tests_that_exist():
    for target in COVERED_ELSEWHERE.values():
        path, name = target.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), target


def test_ci_runs_the_readme_test_command():
    """The README promises that CI runs `python3 dev.py test`: `.ci/run` ends by running exactly
    that, and the README's quickstart names it."""
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "exec python3 dev.py test"
    assert "python3 dev.py test" in (ROOT / "README.md").read_text()


def test_docs_link_only_inside_the_repository():
    """Relative links resolve to files of the repository; nothing links outside it."""
    link = re.compile(r"\]\((?!https?://|#)([^)#\s]+)")
    for document in DOCUMENTS:
        for target in link.findall(document.read_text()):
            resolved = (document.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{document.name} links outside: {target}"
            assert resolved.exists(), f"{document.name} links to a missing file: {target}"
