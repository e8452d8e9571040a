"""The Korean catalogue: every user-facing string is translated, and the shipped .mo is current."""

import gettext
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["manage.py", "portal", "pools", "billing", "monitoring", "templates", "locale"]
CATALOGUE = Path("locale/ko/LC_MESSAGES/django.po")


def test_every_string_is_translated_to_korean(tmp_path):
    for name in SOURCES:
        source = ROOT / name
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, tmp_path / name)
    subprocess.run(
        [sys.executable, "manage.py", "makemessages", "-l", "ko", "--no-location", "--no-obsolete"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    for flag in ("--untranslated", "--only-fuzzy"):
        leftovers = subprocess.run(
            ["msgattrib", flag, "--no-wrap", str(CATALOGUE)], cwd=tmp_path, capture_output=True, text=True
        ).stdout
        entries = [
            line for line in leftovers.splitlines() if line.startswith("msgid ") and line != 'msgid ""'
        ]
        assert entries == [], f"{flag[2:]} strings in the Korean catalogue (run makemessages, translate)"


def test_compiled_catalogue_matches_its_source(tmp_path):
    compiled = tmp_path / "django.mo"
    subprocess.run(["msgfmt", "-o", str(compiled), str(ROOT / CATALOGUE)], check=True)
    with compiled.open("rb") as fresh, (ROOT / CATALOGUE.with_suffix(".mo")).open("rb") as shipped:
        assert gettext.GNUTranslations(shipped)._catalog == gettext.GNUTranslations(fresh)._catalog, (
            "locale/ko/LC_MESSAGES/django.mo is stale: run manage.py compilemessages"
        )
