"""What a cluster's kubeconfig may hold: checked where one comes in and again wherever one is loaded.

A kubeconfig is more than an address and a credential: the Kubernetes client runs the program an
`exec` entry names, asks an `auth-provider` for tokens, and reads any file a path field
(`tokenFile`, `client-certificate`, `client-key`, `certificate-authority`) names, then sends what it
read to the server the same kubeconfig names. The portal's workers hold every tenant's data, so a
kubeconfig here holds inline credentials only, and the same rule is applied when an operator gives
one (admin, command line) and when a stored one is loaded to build a client (rows saved under an
older rule never get to run anything).
"""

from __future__ import annotations

import yaml
from django.utils.translation import gettext as _

from portal.errors import InvalidInput

# Per list of a kubeconfig: the key under which each named entry keeps its settings.
LISTS = {"clusters": "cluster", "contexts": "context", "users": "user"}

# The only settings a cluster or user entry may hold; each is read by the client as text unless it
# is named in NOT_TEXT. Anything else is refused by name.
ALLOWED = {
    "cluster": (
        "server",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "proxy-url",
        "disable-compression",
        "extensions",
    ),
    "user": ("token", "client-certificate-data", "client-key-data", "username", "password"),
}
NOT_TEXT = {"insecure-skip-tls-verify", "disable-compression", "extensions"}

# Settings that name a file on the machine that loads the kubeconfig, with what to give instead.
PATHS = {
    "certificate-authority": "certificate-authority-data",
    "tokenFile": "token",
    "client-certificate": "client-certificate-data",
    "client-key": "client-key-data",
}
# Settings that make the client run a program or fetch credentials from elsewhere.
COMMANDS = ("exec", "auth-provider")


def check_kubeconfig(text: str, context: str) -> dict:
    """The kubeconfig as a mapping, once it is known to be usable and to hold inline credentials only.

    Whatever the text holds, the only exception is InvalidInput, with a message naming what is wrong.
    """
    # Not only YAMLError: PyYAML's constructors raise ValueError, KeyError, IndexError or
    # AttributeError on odd tagged scalars (`!!int ''`, `!!timestamp abc`), RecursionError on deep nesting.
    try:
        config = yaml.safe_load(text)
    except Exception as error:
        raise InvalidInput(_("The kubeconfig is not valid YAML.")) from error
    if not isinstance(config, dict):
        raise InvalidInput(_("The kubeconfig must be a mapping with clusters, contexts and users."))
    if not config.get("clusters") or not config.get("contexts"):
        raise InvalidInput(_("The kubeconfig has no clusters or no contexts."))
    entries = {field: _entries(config, field) for field in LISTS}
    for field in ("clusters", "users"):
        for name, settings in entries[field].items():
            _check_inline_only(field, name, settings)
    current = config.get("current-context")
    if current is not None and not isinstance(current, str):
        raise InvalidInput(_("In the kubeconfig, current-context must be a string."))
    chosen = context or current
    if not chosen:
        raise InvalidInput(_("The kubeconfig names no current context; choose one."))
    if chosen not in entries["contexts"]:
        raise InvalidInput(
            _("The kubeconfig has no context %(context)s (it has: %(names)s).")
            % {"context": chosen, "names": ", ".join(sorted(entries["contexts"]))}
        )
    wiring = entries["contexts"][chosen]
    cluster, user = wiring.get("cluster"), wiring.get("user")
    if not isinstance(cluster, str) or cluster not in entries["clusters"]:
        raise InvalidInput(
            _("In the kubeconfig, context %(context)s names no cluster from clusters.") % {"context": chosen}
        )
    if user is not None and (not isinstance(user, str) or (user and user not in entries["users"])):
        raise InvalidInput(
            _("In the kubeconfig, context %(context)s names a user that is not in users.")
            % {"context": chosen}
        )
    if not entries["clusters"][cluster].get("server"):
        raise InvalidInput(_("In the kubeconfig, cluster %(name)s has no server.") % {"name": cluster})
    used = [("clusters", "cluster", cluster)] + ([("users", "user", user)] if user else [])
    for field, key, name in used:
        found = entries[field][name]
        for setting in ALLOWED[key]:
            if (
                setting not in NOT_TEXT
                and found.get(setting) is not None
                and not isinstance(found[setting], str)
            ):
                raise InvalidInput(
                    _("In the kubeconfig, %(setting)s of %(field)s entry %(name)s must be a string.")
                    % {"setting": setting, "field": field, "name": name}
                )
    return config


def _check_inline_only(field: str, name: str, settings: dict) -> None:
    """Refuse any setting of a cluster or user entry that is not an inline value the portal reads."""
    key = LISTS[field]
    for setting in settings:
        if setting in ALLOWED[key]:
            continue
        values = {"setting": setting, "field": field, "name": name}
        if setting in COMMANDS:
            message = _(
                "In the kubeconfig, %(field)s entry %(name)s uses %(setting)s, which would run a program "
                "or fetch credentials elsewhere; the portal accepts inline credentials only (token, "
                "client-certificate-data with client-key-data, or username and password), e.g. a "
                "service account's token."
            )
        elif setting in PATHS:
            message = _(
                "In the kubeconfig, %(field)s entry %(name)s uses %(setting)s, which names a file; the "
                "portal accepts inline values only: give %(inline)s instead."
            )
            values["inline"] = PATHS[setting]
        else:
            message = _(
                "In the kubeconfig, %(field)s entry %(name)s has %(setting)s, which the portal does not "
                "accept; it takes %(allowed)s."
            )
            values["allowed"] = ", ".join(ALLOWED[key])
        raise InvalidInput(message % values)


def _entries(config: dict, field: str) -> dict[str, dict]:
    """The named entries of one list of a kubeconfig (clusters, contexts, users), by name."""
    items = config.get(field)
    if items is None:
        return {}
    if not isinstance(items, list):
        raise InvalidInput(_("In the kubeconfig, %(field)s must be a list.") % {"field": field})
    key = LISTS[field]
    found: dict[str, dict] = {}
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise InvalidInput(
                _("In the kubeconfig, entry %(number)s of %(field)s is not a mapping.")
                % {"number": number, "field": field}
            )
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                _("In the kubeconfig, entry %(number)s of %(field)s has no name.")
                % {"number": number, "field": field}
            )
        if name in found:
            raise InvalidInput(
                _("In the kubeconfig, %(field)s has two entries named %(name)s.")
                % {"field": field, "name": name}
            )
        if not isinstance(item.get(key), dict):
            raise InvalidInput(
                _("In the kubeconfig, %(field)s entry %(name)s has no %(key)s mapping.")
                % {"field": field, "name": name, "key": key}
            )
        found[name] = item[key]
    return found
