"""Replay README.md as a newcomer would: every example, in order, in a fresh copy.

``tools/newcomer.sh`` makes the copy and runs this; ``tests/test_newcomer.py`` runs both
in CI. Standard library only: it runs with the ``python3`` the README's set-up uses.

Each fenced block of README.md is replayed in order, in one shell whose state carries
from command to command (the environment ``source .venv/bin/activate`` sets, exported
variables, the working directory), with ``HOME`` a fresh folder:

- ``yaml`` whose first line is ``# NAME.yaml``: saved as NAME, as a reader would save it
  (other yaml blocks are fragments; tests/test_docs_yaml.py loads every yaml block).
- ``python``: saved to a file and run with the shell's ``python``.
- ``bash``: each command (a line, with ``\\`` continuations and quotes over several lines)
  must exit 0 and print no traceback. Where a reader runs a command differently from a
  script, the replay does what the reader does:

  - each port the README names (``80xx``) is a free port here, the same one everywhere,
    below the kernel's ephemeral range (no port-0 server or client elsewhere can take it);
  - the first block's ``sordino start`` is the reader's first terminal: it serves on the
    ports that stand for 8000 and 8001 until the replay ends;
  - the first block's other command (the test environment's set-up) is the reader's
    second terminal: it starts once the first server is ready and runs beside the rest of
    the replay, in a shell of its own (its state does not carry); it must exit 0 without
    a traceback before the replay ends. The README has the reader type it while the
    first server serves, so nothing waits on it but the end of the replay (one core
    installs ``.venv-test`` while the other replays the examples);
  - any other ``sordino start`` that names no port, data directory or ``--config`` gets
    ``--http-port 0 --grpc-port 0`` and a data directory of its own, as the README says
    a server beside the first one needs. In the foreground it serves until it is ready,
    then gets Ctrl-C (SIGINT to its process group); with ``&`` it is a job until
    ``kill %N`` (SIGTERM to the group), and the next command runs at once, as when a
    reader pastes the block (so the README must wait for it to be ready). It must exit
    0 either way, and a job still running at the end of its block is an error;
  - ``sordino monitor`` without ``--once`` watches for a few seconds, then gets Ctrl-C;
  - ``pytest`` only collects the suite (this runs inside the suite; .ci/run runs it all),
    so the second terminal's pip is told not to byte-compile (``PIP_NO_COMPILE``);
  - ``curl`` fails on an HTTP error status (``--fail-with-body``).

- any other block, and a block listed with ``--skip FIRST-LINE``, is not replayed; a
  block of another language that is not listed is an error (see :func:`plan`).

Then, in the same shell (the README's ``.venv``, which has only what ``pip install .``
installs), :data:`TOUR` runs each command's happy path against the first server, so a
command that needs a package the install lacks fails here (issue 27: ``sordino quantize``
needed ``onnx``). ``tests/test_newcomer.py`` checks that it names every command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
PORT = re.compile(r"\b80\d\d\b")
LISTENING = re.compile(r"listening on (http://\S+)")
TRACEBACK = "Traceback (most recent call last)"
SORDINO_LINE = re.compile(r"^(journal at |loaded |sordino listening |error: )|sordino\.")
FILE_HEADER = re.compile(r"#\s*(?P<name>[\w.-]+\.ya?ml)\s*")
RUNNABLE = ("bash", "python")
FIRST_SERVER = ("8000", "8001")  # the ports of the README's first `sordino start`
SETUP_TIMEOUT = 900.0  # a command that creates a virtual environment or installs
COMMAND_TIMEOUT = 180.0
READY_TIMEOUT = 120.0
MONITOR_SECONDS = 4.0
PORT_SPAN = 12000  # the replay's ports: within this many of the ephemeral range, outside it


# Each command of `sordino --help` the README does not run, at its primary use, in a fresh
# folder after the README; 8000 is the first server (its data directory is ~/.sordino).
# The README runs start, chaos, models, monitor, profile and diagnose.
TOUR = (
    "sordino --help",
    "sordino models export-builtin models",
    "sordino models list --url http://127.0.0.1:8000",
    "sordino hints embed models/simple/1/model.onnx --max-batch 8 -o hinted.onnx",
    "sordino hints show hinted.onnx",
    "sordino quantize models/digits-classifier/1/model.onnx --int8 --dynamic -o int8.onnx",
    "sordino generate 'a handwritten 7' --steps 4 --url http://127.0.0.1:8000 -o seven.png",
    "sordino monitor --once --url http://127.0.0.1:8000",
    "sordino memory status --url http://127.0.0.1:8000",
    "sordino tenants list --url http://127.0.0.1:8000",
    "sordino events --url http://127.0.0.1:8000",
    "sordino guardian status --url http://127.0.0.1:8000",
    "sordino config show --url http://127.0.0.1:8000",
    "sordino reconfigure --set scheduler.slo_p99_ms=100 --dry-run --url http://127.0.0.1:8000",
    "sordino strategy list",
    "sordino strategy export edge_conservative -o edge.tar.gz",
    "sordino share-strategy --name tour_live --tags tour --description 'the tour'"
    " --license apache-2.0 --url http://127.0.0.1:8000",
    "sordino event mark tour --start",
    "sordino stress-test --url http://127.0.0.1:8000 --model digits-classifier --duration 2s"
    " --peak-rate 20 --output stress.html",
    "sordino event mark tour --end",
    "sordino postmortem --event tour --output postmortem.html",
    "sordino tune --url http://127.0.0.1:8000 --model simple --max-batch 1,8 --delay-us 0"
    " --modes manual --rates 50 --seconds 1 --refine 0",
)


class ReplayFailed(Exception):
    """A README example failed: the message says which and how."""


@dataclass(frozen=True)
class Block:
    """One fenced block of the README."""

    lang: str
    line: int  # of its first line of content
    text: str

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0].strip() if self.text.strip() else ""


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block, in order."""
    return [
        Block(m["lang"].strip(), text.count("\n", 0, m.start()) + 2, m["body"])
        for m in FENCE.finditer(text)
    ]


@dataclass(frozen=True)
class Step:
    """What the replay does with one block: ``run``, ``save`` (as ``target``) or ``skip``."""

    block: Block
    action: str
    target: str = ""


def plan(text: str, skip: set[str]) -> list[Step]:
    """Decide each block's step; raise ValueError for a block that is neither run nor listed.

    A ``--skip`` line that matches no block is an error too, so the list cannot go stale.
    """
    steps, unplanned = [], []
    blocks = readme_blocks(text)
    for block in blocks:
        header = FILE_HEADER.fullmatch(block.first_line)
        if block.first_line in skip:
            steps.append(Step(block, "skip"))
        elif block.lang in RUNNABLE:
            steps.append(Step(block, "run"))
        elif block.lang == "yaml":
            steps.append(Step(block, "save", header["name"]) if header else Step(block, "skip"))
        else:
            unplanned.append(f"line {block.line}: ```{block.lang} {block.first_line!r}")
    stale = skip - {block.first_line for block in blocks}
    problems = [f"neither replayed nor listed as not runnable: {u}" for u in unplanned]
    problems += [f"listed as not runnable but in no block: {line!r}" for line in sorted(stale)]
    if problems:
        raise ValueError("; ".join(problems))
    return steps


def commands(text: str) -> list[str]:
    """Split a bash block into its commands, comments removed."""
    found, current = [], ""
    for line in text.splitlines():
        current += line + "\n"
        clean, open_quote = _without_comments(current)
        if open_quote or clean.rstrip().endswith("\\"):
            continue
        if clean.strip():
            found.append(clean.replace("\\\n", " ").strip())  # "\\" + newline: one line
        current = ""
    if current.strip():
        raise ReplayFailed(f"unterminated command: {current!r}")
    return found


def _without_comments(text: str) -> tuple[str, bool]:
    """The text without shell comments, and whether a quote is still open at its end."""
    out, quote, word_start, i = [], "", True, 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"' and i + 1 < len(text):
                out.append(char)
                i += 1
                char = text[i]
        elif char == "#" and word_start:
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif char in "'\"":
            quote = char
        elif char == "\\" and i + 1 < len(text):
            out.append(char)
            i += 1
            char = text[i]
        out.append(char)
        word_start = char in " \t\n;&|(" and not quote
        i += 1
    return "".join(out), bool(quote)


@dataclass
class Process:
    """A child process whose output is echoed (indented) and kept."""

    name: str
    popen: subprocess.Popen[str]
    echo: bool = True  # False: kept, and shown only when it fails (pip's pages of output)
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(
        cls, name: str, argv: list[str], env: dict[str, str], cwd: Path, *, echo: bool = True
    ) -> Process:
        popen = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
        process = cls(name, popen, echo)
        process.pump = threading.Thread(target=process._pump, daemon=True)
        process.pump.start()
        return process

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self.lock:
                self.lines.append(line.rstrip("\n"))
                if self.echo:
                    self.show(line)

    def show(self, line: str) -> None:
        print(f"    {self.name}| {line.rstrip()}", flush=True)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float, what: str) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.popen.wait()
            raise ReplayFailed(f"{what} did not end within {timeout:.0f} s") from None
        if self.pump is not None:
            self.pump.join(timeout=10)  # the last lines (a child left running keeps the pipe)
        return code

    def check(self, code: int, what: str) -> None:
        problem = f"exited with {code}" if code != 0 else ""
        if not problem and TRACEBACK in self.output:
            problem = "printed a traceback"
        if problem:
            tail = "" if self.echo else "; its output ended:\n" + "\n".join(self.lines[-60:])
            raise ReplayFailed(f"{what} {problem}{tail}")
        if not self.echo:
            last = self.lines[-1] if self.lines else ""
            print(f"    {self.name}| ({len(self.lines)} lines of output, the last: {last})")


@dataclass
class Server:
    process: Process
    url: str


@dataclass
class Terminal:
    """A command running in a terminal of its own (the README's "another terminal")."""

    process: Process
    text: str
    started: float


class Replay:
    """The reader's shell: its state, its jobs and the first server."""

    def __init__(self, work: Path, readme: str) -> None:
        self.repo = work / "repo"
        self.scratch = work / "replay"
        self.scratch.mkdir(parents=True, exist_ok=True)
        (work / "home").mkdir(exist_ok=True)
        self.env = _clean_environment(work / "home")
        self.cwd = self.repo
        self.ports = _free_ports(sorted({*PORT.findall(readme), *FIRST_SERVER}))
        self.first_server: Server | None = None
        self.second_terminal: Terminal | None = None
        self.jobs: dict[int, Server] = {}
        self.count = 0
        self.started: list[Process] = []  # every process, for close(failed=True)

    # --- one step per block ------------------------------------------------------------

    def replay(self, step: Step, first_block: bool) -> None:
        block = step.block
        text = self.rewrite_ports(block.text)
        if step.action == "save":
            (self.cwd / step.target).write_text(text, encoding="utf-8")
            print(f"  saved {step.target}")
        elif block.lang == "python":
            path = self.scratch / f"block-{block.line}.py"
            path.write_text(text, encoding="utf-8")
            self.run(f"python {shlex.quote(str(path))}", COMMAND_TIMEOUT)
        else:
            for command in commands(text):
                started = time.monotonic()
                self.command(command, first_block)
                print(f"    ({time.monotonic() - started:.1f} s)", flush=True)
            if self.jobs:
                raise ReplayFailed(
                    f"a server started with & in this block still runs at its end "
                    f"(jobs {sorted(self.jobs)}); the README should stop it (kill %1)"
                )

    def command(self, text: str, first_block: bool) -> None:
        words = shlex.split(text)
        program = _program(words)
        print(f"  $ {text}", flush=True)
        if program[:2] == ["sordino", "start"]:
            background = bool(re.search(r"(?<!&)&\s*$", text))
            text = re.sub(r"\s*(?<!&)&\s*$", "", text)
            if first_block and self.first_server is None:
                self.first_server = self.start_server(self.first_server_flags(text, words))
            elif background:
                job = max(self.jobs, default=0) + 1
                # A reader pastes the next line at once: the README must wait for it.
                self.jobs[job] = self.start_server(self.beside_first(text, words), wait=False)
            else:
                server = self.start_server(self.beside_first(text, words))
                self.stop(server, signal.SIGINT, "Ctrl-C")
        elif program[:1] == ["kill"] and words[-1].startswith("%"):
            self.kill(words)
        elif program[:2] == ["sordino", "monitor"] and "--once" not in words:
            self.watch(text)
        else:
            if program[:1] == ["curl"]:
                text = re.sub(r"\bcurl\b", "curl --fail-with-body", text, count=1)
            if "pytest" in program:
                text += " --collect-only -q"
            setup = any(w in ("venv", "install") for w in words)
            if first_block and self.first_server is not None and self.second_terminal is None:
                self.second_terminal = self.open_terminal(text)
                return
            timeout = SETUP_TIMEOUT if setup else COMMAND_TIMEOUT
            self.run(text, timeout, quiet=setup or "pytest" in program)

    # --- commands ------------------------------------------------------------------------

    def spawn(self, name: str, script: str, env: dict[str, str], *, echo: bool = True) -> Process:
        """Start ``bash -c SCRIPT`` in a process group of its own, remembered for close()."""
        process = Process.start(name, ["bash", "-c", script], env, self.cwd, echo=echo)
        self.started.append(process)
        return process

    def run(self, text: str, timeout: float, *, quiet: bool = False) -> None:
        """Run one command in the shell's state; keep the state it leaves.

        ``quiet``: its output is shown only if it fails (pip's and pytest's pages of it).
        """
        state = self.scratch / "state"
        script = (
            'cd "$NEWCOMER_CWD" && eval "$NEWCOMER_CMD"; rc=$?; '
            'pwd > "$NEWCOMER_STATE.pwd"; env -0 > "$NEWCOMER_STATE.env"; exit $rc'
        )
        env = {**self.env, "NEWCOMER_CMD": text, "NEWCOMER_CWD": str(self.cwd),
               "NEWCOMER_STATE": str(state)}  # fmt: skip
        process = self.spawn("", script, env, echo=not quiet)
        process.check(process.wait(timeout, repr(text)), repr(text))
        self.cwd = Path(Path(f"{state}.pwd").read_text().strip())
        pairs = Path(f"{state}.env").read_text().split("\0")
        self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
        for name in ("NEWCOMER_CMD", "NEWCOMER_CWD", "NEWCOMER_STATE", "_", "OLDPWD", "PWD"):
            self.env.pop(name, None)

    def open_terminal(self, text: str) -> Terminal:
        """Run one command in a terminal of its own, beside the replay (quiet unless it fails)."""
        # Its pip does not byte-compile what it installs: this terminal then only collects
        # the suite, which compiles the few modules it imports (the install's other
        # thousands of modules took a minute of CPU to compile, beside the suite).
        env = {**self.env, "NEWCOMER_CMD": text, "NEWCOMER_CWD": str(self.cwd),
               "PIP_NO_COMPILE": "1"}  # fmt: skip
        script = 'cd "$NEWCOMER_CWD" && eval "$NEWCOMER_CMD"'
        print("    (second terminal: runs beside the replay until its end)", flush=True)
        process = self.spawn("terminal 2", script, env, echo=False)
        return Terminal(process, text, time.monotonic())

    def close_terminal(self) -> None:
        """Wait for the second terminal's command; it must have exited 0, no traceback."""
        terminal, self.second_terminal = self.second_terminal, None
        if terminal is None:
            return
        what = f"{terminal.text!r} (the second terminal)"
        waited = time.monotonic()
        left = SETUP_TIMEOUT - (waited - terminal.started)
        terminal.process.check(terminal.process.wait(max(left, 1.0), what), what)
        took, waited = time.monotonic() - terminal.started, time.monotonic() - waited
        print(f"  (it took {took:.1f} s; the replay waited {waited:.1f} s of it)", flush=True)

    def start_server(self, text: str, *, wait: bool = True) -> Server:
        """Start a server in its own process group; return once it answers ready.

        ``wait=False`` (a job started with ``&``): return at once, as a shell does.
        """
        self.count += 1
        script = 'trap : INT TERM; cd "$NEWCOMER_CWD" && eval "$NEWCOMER_CMD"'
        env = {**self.env, "NEWCOMER_CMD": text, "NEWCOMER_CWD": str(self.cwd)}
        print(f"    (server {self.count}: {text})", flush=True)
        setup = "install" in text  # the first set-up command: quiet until it serves
        name = f"server {self.count}"
        process = self.spawn(name, script, env, echo=not setup)
        what = f"server {self.count} ({text!r})"
        if not wait:
            return Server(process, "")
        began = time.monotonic()
        deadline = began + SETUP_TIMEOUT
        while True:
            urls = [m[1] for line in process.lines if (m := LISTENING.search(line))]
            if urls:
                break
            if process.popen.poll() is not None:
                raise ReplayFailed(f"{what} exited with {process.popen.returncode} before serving")
            if time.monotonic() > deadline:
                process.signal_group(signal.SIGKILL)
                raise ReplayFailed(f"{what} printed no URL within {SETUP_TIMEOUT:.0f} s")
            time.sleep(0.2)
        _wait_ready(urls[0].replace("//0.0.0.0:", "//127.0.0.1:"), what)
        with process.lock:
            if not process.echo:  # show from sordino's first line on
                own = [i for i, line in enumerate(process.lines) if SORDINO_LINE.search(line)]
                first = own[0] if own else 0
                print(f"    {name}| ({first} lines of set-up output)")
                print(f"    ({name} ready {time.monotonic() - began:.1f} s after its command)")
                for line in process.lines[first:]:
                    process.show(line)
                process.echo = True
        return Server(process, urls[0])

    def stop(self, server: Server, sig: signal.Signals, how: str) -> None:
        server.process.signal_group(sig)
        what = f"{server.process.name} after {how}"
        server.process.check(server.process.wait(60, what), what)

    def kill(self, words: list[str]) -> None:
        number = int(words[-1].lstrip("%") or max(self.jobs, default=0))
        if number not in self.jobs:
            raise ReplayFailed(f"kill {words[-1]}: no such job (running: {sorted(self.jobs)})")
        name = words[1].lstrip("-").upper() if len(words) == 3 else "TERM"
        sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        self.stop(self.jobs.pop(number), sig, f"kill {' '.join(words[1:])}")

    def watch(self, text: str) -> None:
        """Run a command that runs until Ctrl-C for a few seconds, then press Ctrl-C."""
        env = {**self.env, "NEWCOMER_CMD": text, "NEWCOMER_CWD": str(self.cwd)}
        script = 'trap : INT; cd "$NEWCOMER_CWD" && eval "$NEWCOMER_CMD"'
        process = self.spawn("", script, env)
        time.sleep(MONITOR_SECONDS)
        if process.popen.poll() is not None:
            process.check(process.popen.returncode, repr(text))
            raise ReplayFailed(f"{text!r} ended by itself; it should run until Ctrl-C")
        process.signal_group(signal.SIGINT)
        process.check(process.wait(30, repr(text)), f"{text!r} after Ctrl-C")

    # --- flags and ports -----------------------------------------------------------------

    def rewrite_ports(self, text: str) -> str:
        return PORT.sub(lambda m: str(self.ports[m[0]]), text)

    def first_server_flags(self, text: str, words: list[str]) -> str:
        http, grpc = (self.ports[port] for port in FIRST_SERVER)
        if _has(words, "--http-port", "--grpc-port", "--config"):
            raise ReplayFailed("the first server should start on the default ports")
        return f"{text} --http-port {http} --grpc-port {grpc}"

    def beside_first(self, text: str, words: list[str]) -> str:
        """Add what a server beside the first one needs and the README line does not give."""
        if _has(words, "--config"):
            return text
        if not _has(words, "--http-port"):
            text += " --http-port 0"
        if not _has(words, "--grpc-port"):
            text += " --grpc-port 0"
        if not _has(words, "--data-dir"):
            text += f" --data-dir {self.scratch / f'data-{self.count + 1}'}"
        return text

    def tour(self) -> None:
        """Run :data:`TOUR` in a fresh folder, in the shell the README left."""
        self.cwd = self.scratch / "tour"
        self.cwd.mkdir()
        for text in TOUR:
            started = time.monotonic()
            self.command(self.rewrite_ports(text), first_block=False)
            print(f"  ({time.monotonic() - started:.1f} s)", flush=True)

    def close(self, failed: bool) -> None:
        """Stop the first server (Ctrl-C) and any job left; on failure, kill every process."""
        servers = [*self.jobs.values(), *([self.first_server] if self.first_server else [])]
        self.jobs.clear()
        if failed and self.second_terminal is not None:
            self.second_terminal.process.signal_group(signal.SIGKILL)
            self.second_terminal.process.popen.wait()
            self.second_terminal = None
        for server in servers:
            if failed or server is not self.first_server:
                server.process.signal_group(signal.SIGKILL)
                server.process.popen.wait()
        if not failed and self.first_server is not None:
            print("  (Ctrl-C to the first server)", flush=True)
            self.stop(self.first_server, signal.SIGINT, "Ctrl-C")
        if failed:  # also what no server or job holds yet: a set-up still installing, say
            for process in self.started:
                if process.popen.poll() is None:
                    process.signal_group(signal.SIGKILL)
                    process.popen.wait()


def _program(words: list[str]) -> list[str]:
    """The last command of an ``&&`` chain, without leading assignments, program basenamed."""
    if "&&" in words:
        words = words[len(words) - words[::-1].index("&&") :]
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    return [Path(words[0]).name, *words[1:]] if words else []


def _has(words: list[str], *flags: str) -> bool:
    return any(w == f or w.startswith(f + "=") for w in words for f in flags)


def _free_ports(names: list[str]) -> dict[str, int]:
    """A distinct free loopback port for each port number the README names.

    Taken outside the kernel's ephemeral range, which it never hands out by itself: a
    server on port 0 or a client's connection elsewhere (the suite runs beside the
    replay: tests/readme_replay.py) cannot take one of them between now and the
    replay's server binding it, minutes later for some.
    """
    low, high = _ephemeral_range()
    choices = list(range(max(1024, low - PORT_SPAN), low)) or list(range(high + 1, 65536))
    rng = random.Random()
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        if not choices:
            raise ReplayFailed(f"no free loopback port outside the ephemeral {low}-{high}")
        port = choices.pop(rng.randrange(len(choices)))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: another
        ports[names[len(ports)]] = port
    return ports


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _wait_ready(url: str, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ReplayFailed(f"{what} never answered ready at {url}")
        time.sleep(0.2)


def _clean_environment(home: Path) -> dict[str, str]:
    """The environment of a new terminal: no virtual environment, no sordino settings.

    ``HOME`` is a fresh folder (the first server's ``~/.sordino`` is the replay's own);
    pip keeps its cache and configuration where they were, so installs may reuse it.
    """
    env = dict(os.environ)
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env.setdefault("PIP_CACHE_DIR", str(Path(cache) / "pip"))
    env.setdefault("XDG_CONFIG_HOME", str(Path.home() / ".config"))
    env.setdefault("XDG_CACHE_HOME", cache)
    for name in list(env):
        if name.startswith(("SORDINO_", "PYTEST_", "NEWCOMER_")) or name in (
            "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "CONDA_PREFIX",
        ):  # fmt: skip
            del env[name]
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if not (Path(p).parent / "pyvenv.cfg").exists())
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"  # a server's "listening on" line is seen when printed
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="a folder holding the fresh copy in repo/")
    parser.add_argument(
        "--skip", action="append", default=[], metavar="FIRST-LINE",
        help="the first line of a block that is not runnable (tests/test_newcomer.py)",
    )  # fmt: skip
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # children get Ctrl-C back
    readme = (args.work / "repo" / "README.md").read_text(encoding="utf-8")
    try:
        steps = plan(readme, set(args.skip))
    except ValueError as exc:
        print(f"newcomer: README.md: {exc}", flush=True)
        return 1
    replay = Replay(args.work, readme)
    print(f"newcomer: replaying README.md, ports {replay.ports}", flush=True)
    began = time.monotonic()
    failed, block = True, steps[0].block
    try:
        for index, step in enumerate(steps):
            block = step.block
            print(f"--- README.md:{block.line} ```{block.lang}: {step.action}", flush=True)
            if step.action != "skip":
                started = time.monotonic()
                replay.replay(step, first_block=index == 0)
                print(f"  ({time.monotonic() - started:.1f} s)", flush=True)
        print("--- every command's happy path (TOUR)", flush=True)
        toured = time.monotonic()
        replay.tour()
        print(f"  (the tour: {time.monotonic() - toured:.0f} s)", flush=True)
        block = steps[0].block
        print(f"--- README.md:{block.line}: the second terminal's command", flush=True)
        replay.close_terminal()
        failed = False
        replay.close(failed=False)
    except ReplayFailed as exc:
        print(f"newcomer: FAILED at README.md:{block.line}: {exc}", flush=True)
        return 1
    finally:
        if failed:
            replay.close(failed=True)
    print(f"newcomer: README.md replayed in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
