"""A small reader of deploy/Dockerfile and .dockerignore for the image's tests: instructions with their
line continuations joined, grouped into build stages, and the paths a build context leaves out.

Only what the portal's Dockerfile uses is understood: comments, `\\` continuations, FROM ... AS, and the
shell and JSON forms of instructions. No parser directive or heredoc is expected.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    arguments: str
    line: int

    def words(self) -> list[str]:
        """The arguments split as the shell (or the JSON form) would: flags and paths one by one."""
        if self.arguments.startswith("["):
            return json.loads(self.arguments)
        return shlex.split(self.arguments)


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    @property
    def repository(self) -> str:
        return self.image.rpartition(":")[0] if self.tag else self.image

    @property
    def tag(self) -> str:
        last = self.image.rpartition("/")[2].partition("@")[0]
        return last.rpartition(":")[2] if ":" in last else ""


def instructions(text: str) -> list[Instruction]:
    """Logical instructions: comment lines dropped (also inside a continuation, as Docker drops them)."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].strip() if continued else line)
        if not continued:
            keyword, _, arguments = " ".join(pending).partition(" ")
            found.append(Instruction(keyword.upper(), arguments.strip(), start))
            pending = []
    if pending:
        raise ValueError(f"the instruction at line {start} never ends: its last line has a continuation")
    return found


def stages(text: str) -> list[Stage]:
    result: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.words() if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            result.append(Stage(image=words[0], name=name))
        elif not result:
            if instruction.keyword != "ARG":
                raise ValueError(f"line {instruction.line}: {instruction.keyword} before the first FROM")
        else:
            result[-1].instructions.append(instruction)
    return result


def shell_commands(run: Instruction) -> list[list[str]]:
    """The simple commands of a RUN, split at `&&`, `||` and `;`."""
    commands: list[list[str]] = [[]]
    lexer = shlex.shlex(run.arguments, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    for token in lexer:
        if token in ("&&", "||", ";"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def apt_packages(stage: Stage) -> set[str]:
    """Every package a stage installs with apt-get or apt."""
    packages: set[str] = set()
    for run in stage.of("RUN"):
        for command in shell_commands(run):
            if command[:1] in (["apt-get"], ["apt"]) and "install" in command:
                after = command[command.index("install") + 1 :]
                packages |= {word for word in after if not word.startswith("-")}
    return packages


def ignored(patterns: list[str], path: str) -> bool:
    """Whether .dockerignore leaves `path` (relative to the context) out: the last matching pattern wins,
    `!` brings a path back, and a left-out folder takes everything in it along."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        variants = {pattern, pattern.replace("**/", "")} if pattern.startswith("**/") else {pattern}
        if any(fnmatch.fnmatchcase(candidate, variant) for candidate in candidates for variant in variants):
            result = not negated
    return result


def ignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
