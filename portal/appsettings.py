"""Each app's own settings, declared with their defaults in the app (`<app>/conf.py`), so that the shell's
settings module names none of them.

    # pools/conf.py
    settings = AppSettings(
        CAPACITY_SYNC_SECONDS=Setting.int(60, minimum=1),
        POOL_REDRIVE_SECONDS=Setting.int(lambda s: s.MIG_PENDING_TIMEOUT_SECONDS + 300),
    )

`settings.NAME` is, in this order: Django's setting NAME when one is set (so a deployment may still set it in
a settings module, and tests override it as any other setting), else the environment variable NAME (or `.env`,
which the shell's settings read) parsed as the setting's kind, else the default (a callable default is given
the app's settings, for a default derived from another). A name the app does not declare is the shell's:
Django's setting of that name. An app's modules therefore read every setting through their `conf.settings`.

A value the environment gives that does not parse, or falls below its minimum, stops the process when the app
loads (`check`, called from the app's `ready`), naming the variable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import environ
from django.conf import UserSettingsHolder
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.functional import empty

env = environ.Env()


@dataclass(frozen=True)
class Setting:
    """One setting: how its environment variable is read, and its default."""

    read: Callable[[str], Any]
    default: Any
    minimum: float | None = None

    @classmethod
    def int(cls, default, *, minimum: float | None = None) -> Setting:
        return cls(env.int, default, minimum)

    @classmethod
    def optional_int(cls, default, *, minimum: float | None = None) -> Setting:
        """A whole number, or none: the variable empty or `none`."""
        return cls(_optional_int, default, minimum)

    @classmethod
    def float(cls, default, *, minimum: float | None = None) -> Setting:
        return cls(env.float, default, minimum)

    @classmethod
    def decimal(cls, default, *, minimum: float | None = None) -> Setting:
        return cls(_decimal, default if callable(default) else Decimal(str(default)), minimum)

    @classmethod
    def str(cls, default="") -> Setting:
        return cls(env.str, default)

    @classmethod
    def bool(cls, default: bool) -> Setting:
        return cls(env.bool, default)

    @classmethod
    def list(cls, default) -> Setting:
        return cls(env.list, default)

    @classmethod
    def numbers(cls, default, *, minimum: float | None = None) -> Setting:
        """Numbers separated by commas, e.g. `7,2,1` (empty: none); `minimum` holds for each."""
        return cls(_numbers, tuple(default), minimum)


def _optional_int(name: str) -> int | None:
    return None if env.str(name).strip().lower() in ("", "none") else env.int(name)


def _numbers(name: str) -> tuple[float, ...]:
    parts = [part.strip() for part in env.str(name).split(",") if part.strip()]
    try:
        return tuple(float(part) for part in parts)
    except ValueError:
        raise ValueError(f"not numbers separated by commas: {env.str(name)!r}") from None


def _decimal(name: str) -> Decimal:
    try:
        return Decimal(env.str(name))
    except InvalidOperation:
        raise ValueError(f"not a number: {env.str(name)!r}") from None


_UNSET = object()


def _given(name: str) -> Any:
    """Django's setting `name` where one is set, else _UNSET. Read from the settings' own dictionaries as
    Django's lookup finds it (an override on top, with the names it deletes, over the settings it
    overrides), because Django answers a name that is not set with an AttributeError, which costs more than
    the rest of the read: an app's setting left at its default is read that way on every request."""
    holder = django_settings._wrapped
    if holder is empty:
        return getattr(django_settings, name, _UNSET)  # the first read: it configures the settings
    while isinstance(holder, UserSettingsHolder):
        if name in holder.__dict__:
            return holder.__dict__[name]
        if name in holder._deleted:
            return _UNSET
        holder = holder.default_settings
    return vars(holder).get(name, _UNSET)


class AppSettings:
    """An app's declared settings, read as the module docstring says."""

    def __init__(self, **declared: Setting) -> None:
        self._declared = declared
        self._from_environment: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        declared = self.__dict__.get("_declared", {})
        if name not in declared:
            return getattr(django_settings, name)
        given = _given(name)
        if given is not _UNSET:
            return given
        if name not in self._from_environment:
            self._from_environment[name] = self._read(name, declared[name])
        return self._from_environment[name]

    def _read(self, name: str, setting: Setting) -> Any:
        if name in env.ENVIRON:
            try:
                value = setting.read(name)
            except (ValueError, ImproperlyConfigured) as error:
                raise ImproperlyConfigured(f"{name}: {error}") from None
            values = value if isinstance(value, tuple) else (value,)
            for one in values:
                if setting.minimum is not None and one is not None and one < setting.minimum:
                    raise ImproperlyConfigured(f"{name} must be at least {setting.minimum}, not {one}.")
            return value
        return setting.default(self) if callable(setting.default) else setting.default

    def names(self) -> list[str]:
        return list(self._declared)

    def check(self) -> None:
        """Read every declared setting once, so that a bad value stops the process as it starts."""
        for name in self._declared:
            getattr(self, name)
