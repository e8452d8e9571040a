"""The portal's container image, read from deploy/Dockerfile and .dockerignore (no Docker engine is needed):
pinned bases, compilers only in the builder, a non-root runtime that has what the portal reads at run time."""

import gettext
import re

import pytest

from billing.conf import settings as billing_settings
from tests.deploy.dockerfile import (
    apt_packages,
    ignore_patterns,
    ignored,
    instructions,
    shell_commands,
    stages,
)
from tests.deploy.manifests import DEPLOY, ROOT

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm$")
COMPILERS = {"gcc", "g++", "build-essential", "make", "clang", "cpp"}


@pytest.fixture
def builder():
    return stages(DOCKERFILE)[0]


@pytest.fixture
def runtime():
    return stages(DOCKERFILE)[-1]


def test_continuations_are_joined_and_comments_dropped():
    text = "FROM a:1 AS one\n# note\nRUN x \\\n    # inside\n    && y\nUSER 10001\n"

    assert [(i.keyword, i.arguments, i.line) for i in instructions(text)] == [
        ("FROM", "a:1 AS one", 1),
        ("RUN", "x && y", 3),
        ("USER", "10001", 6),
    ]
    with pytest.raises(ValueError, match="never ends"):
        instructions("RUN x \\\n")


def test_two_stages_on_the_same_pinned_slim_base():
    found = stages(DOCKERFILE)

    assert len(found) == 2
    assert [stage.name for stage in found] == ["builder", "runtime"]
    assert all(BASE.match(stage.image) for stage in found), [stage.image for stage in found]
    assert found[0].image == found[1].image
    assert all(stage.tag not in ("", "latest") for stage in found)


def test_the_builder_makes_the_virtual_environment_from_the_pinned_requirements(builder):
    commands = [command for run in builder.of("RUN") for command in shell_commands(run)]

    assert ["python", "-m", "venv", "/opt/venv"] in commands
    assert ["pip", "install", "--no-cache-dir", "-r", "requirements.txt"] in commands
    copied = [copy.words() for copy in builder.of("COPY")]
    assert ["requirements.txt", "."] in copied
    # The pins are exact, so that the image is the one the tests ran against.
    requirements = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.strip()]
    assert all("==" in line for line in requirements if not line.startswith("#"))


def test_the_runtime_installs_the_cjk_font_and_no_compiler(runtime):
    packages = apt_packages(runtime)

    assert packages == {"fonts-noto-cjk"}
    assert not packages & COMPILERS
    assert "gettext" not in packages
    # The font the invoices are printed with is where the package puts it, and the build checks it.
    font = billing_settings.BILLING_PDF_FONT
    assert font == "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"
    assert any(["test", "-f", font] == c for run in runtime.of("RUN") for c in shell_commands(run))


def test_the_runtime_copies_the_virtual_environment_and_the_app(runtime):
    copies = [copy.words() for copy in runtime.of("COPY")]

    assert ["--from=builder", "/opt/venv", "/opt/venv"] in copies
    assert [".", "/app"] in copies
    assert [workdir.arguments for workdir in runtime.of("WORKDIR")] == ["/app"]


def environment(stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for env in stage.of("ENV"):
        for word in env.words():
            key, _, value = word.partition("=")
            values[key] = value
    return values


def test_the_runtime_environment(runtime):
    env = environment(runtime)

    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"
    assert env["HOME"].startswith("/tmp")  # the only writable place in the cluster
    assert "SECRET_KEY" not in env  # a key baked into the image would be everyone's key


def test_static_files_are_collected_at_build_time_with_a_throwaway_key(runtime):
    (collect,) = [run for run in runtime.of("RUN") if "collectstatic" in run.arguments]
    (command,) = [c for c in shell_commands(collect) if "collectstatic" in c]

    assert command == [
        "SECRET_KEY=build-only",
        "DEBUG=false",
        "python",
        "manage.py",
        "collectstatic",
        "--noinput",
    ]


def test_the_runtime_runs_as_a_non_root_user_and_serves_the_web_by_default(runtime):
    users = runtime.of("USER")
    position = {id(i): n for n, i in enumerate(runtime.instructions)}

    assert users and users[-1].arguments == "10001"
    assert all(position[id(run)] < position[id(users[-1])] for run in runtime.of("RUN"))
    assert runtime.of("EXPOSE")[-1].words() == ["8000", "9540"]
    assert runtime.of("CMD")[-1].words() == ["gunicorn", "--config", "deploy/gunicorn.conf.py", "portal.wsgi"]


IGNORE = ignore_patterns((ROOT / ".dockerignore").read_text())


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".env",
        ".run/worker.log",
        "staticfiles/staticfiles.json",
        "tests/factories.py",
        "bench/sync.py",
        "docs/screenshots/home.png",
        "portal/__pycache__/settings.cpython-311.pyc",
        "node_modules/x/index.js",
    ],
)
def test_the_build_context_leaves_out_history_local_state_and_tests(path):
    assert ignored(IGNORE, path)


@pytest.mark.parametrize(
    "path",
    [
        "requirements.txt",
        "manage.py",
        "portal/settings.py",
        "pools/drivers/kubernetes/__init__.py",
        "templates/base.html",
        "static/portal/portal.css",
        "locale/ko/LC_MESSAGES/django.mo",
        "deploy/gunicorn.conf.py",
    ],
)
def test_the_build_context_keeps_what_the_image_runs(path):
    assert not ignored(IGNORE, path)


def test_the_ignore_rules_are_read_as_docker_reads_them():
    patterns = ["tests", "**/__pycache__", "*.log", "!keep.log"]

    assert ignored(patterns, "tests/deploy/test_image.py")
    assert ignored(patterns, "a/b/__pycache__/c.pyc")
    assert not ignored(patterns, "keep.log")
    assert not ignored(patterns, "portal/tests.py")


def test_every_translation_ships_compiled_since_the_image_has_no_gettext():
    catalogues = sorted((ROOT / "locale").glob("*/LC_MESSAGES/*.po"))

    assert catalogues
    for po in catalogues:
        mo = po.with_suffix(".mo")
        assert mo.is_file(), f"{po.relative_to(ROOT)} has no compiled {mo.name}"
        with mo.open("rb") as compiled:
            translations = gettext.GNUTranslations(compiled)
        assert len(translations._catalog) > 1, f"{mo.relative_to(ROOT)} holds no translation"
