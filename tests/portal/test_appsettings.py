"""Each app's own settings: Django's setting first, then the environment, then the declared default."""

from decimal import Decimal

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from portal.appsettings import AppSettings, Setting


def declared():
    return AppSettings(
        THING_SECONDS=Setting.int(60, minimum=1),
        THING_LATER_SECONDS=Setting.int(lambda s: s.THING_SECONDS + 300),
        THING_RATE=Setting.decimal("10"),
        THING_ON=Setting.bool(False),
        THING_NAMES=Setting.list(["a"]),
    )


def test_defaults_when_nothing_is_set(monkeypatch):
    for name in ("THING_SECONDS", "THING_LATER_SECONDS", "THING_RATE", "THING_ON", "THING_NAMES"):
        monkeypatch.delenv(name, raising=False)
    conf = declared()
    assert (conf.THING_SECONDS, conf.THING_LATER_SECONDS) == (60, 360)
    assert Decimal("10") == conf.THING_RATE and conf.THING_ON is False and conf.THING_NAMES == ["a"]


def test_the_environment_is_parsed_as_the_kind(monkeypatch):
    monkeypatch.setenv("THING_SECONDS", "90")
    monkeypatch.setenv("THING_RATE", "7.5")
    monkeypatch.setenv("THING_ON", "true")
    monkeypatch.setenv("THING_NAMES", "x,y")
    conf = declared()
    assert conf.THING_SECONDS == 90 and conf.THING_LATER_SECONDS == 390
    assert Decimal("7.5") == conf.THING_RATE and conf.THING_ON is True and conf.THING_NAMES == ["x", "y"]


def test_djangos_setting_wins_so_tests_and_settings_modules_may_set_it(monkeypatch, settings):
    monkeypatch.setenv("THING_SECONDS", "90")
    conf = declared()
    settings.THING_SECONDS = 5
    assert conf.THING_SECONDS == 5
    del settings.THING_SECONDS
    assert conf.THING_SECONDS == 90


def test_a_name_not_declared_is_the_shells(settings):
    settings.PORTAL_BASE_URL = "https://portal.example"
    assert declared().PORTAL_BASE_URL == "https://portal.example"
    with pytest.raises(AttributeError):
        declared().NO_SUCH_SETTING_ANYWHERE  # noqa: B018


@pytest.mark.parametrize(("value", "words"), [("soon", "THING_SECONDS"), ("0", "at least 1")])
def test_a_bad_value_stops_the_check_naming_the_variable(monkeypatch, value, words):
    monkeypatch.setenv("THING_SECONDS", value)
    with pytest.raises(ImproperlyConfigured, match=words):
        declared().check()


def test_the_apps_settings_all_read():
    """Every app's declared settings read without error as the test environment sets them."""
    from django.apps import apps

    from portal.appsettings import AppSettings as Kind

    found = []
    for config in apps.get_app_configs():
        try:
            module = __import__(f"{config.name}.conf", fromlist=["settings"])
        except ModuleNotFoundError:
            continue
        conf = module.settings
        assert isinstance(conf, Kind)
        conf.check()
        found.append(config.name)
    assert found, "no app declares its settings"


@pytest.mark.parametrize(("value", "read"), [(None, None), ("", None), ("none", None), ("12", 12)])
def test_an_optional_number_may_be_none(monkeypatch, value, read):
    if value is None:
        monkeypatch.delenv("THING_LIMIT", raising=False)
    else:
        monkeypatch.setenv("THING_LIMIT", value)
    assert read == AppSettings(THING_LIMIT=Setting.optional_int(None, minimum=0)).THING_LIMIT


def test_an_optional_number_below_its_minimum_stops_the_check(monkeypatch):
    monkeypatch.setenv("THING_LIMIT", "-1")
    with pytest.raises(ImproperlyConfigured, match="at least 0"):
        AppSettings(THING_LIMIT=Setting.optional_int(None, minimum=0)).check()


def test_overrides_are_read_through_down_to_the_settings_module(monkeypatch, settings):
    monkeypatch.delenv("THING_SECONDS", raising=False)
    conf = declared()
    settings.THING_SECONDS = 5
    with override_settings(THING_RATE=Decimal("3")):
        # One from the override below the one on top, one from the one on top.
        assert conf.THING_SECONDS == 5
        assert Decimal("3") == conf.THING_RATE
        with override_settings():
            del django_settings.THING_SECONDS  # by the override on top only
            assert conf.THING_SECONDS == 60
        assert conf.THING_SECONDS == 5
    # A declared name that the settings module sets is read from there, beneath the tests' overrides.
    assert AppSettings(ROOT_URLCONF=Setting.str("elsewhere")).ROOT_URLCONF == "portal.urls"
