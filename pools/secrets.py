"""Encryption at rest for cluster credentials (kubeconfigs, the user:password of a Prometheus URL).

The key comes from CLUSTER_SECRETS_KEY when set, else is derived from SECRET_KEY;
changing either makes stored credentials unreadable, so their clusters must be registered again.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken

from pools.conf import settings


class SecretUnreadable(Exception):
    """The stored secret was encrypted with another key."""


def _fernet() -> Fernet:
    material = settings.CLUSTER_SECRETS_KEY or settings.SECRET_KEY
    key = hashlib.sha256(("gpu-portal cluster secrets:" + material).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token: str, *, what: str = "kubeconfig") -> str:
    """The text `token` holds; `what` names the secret in the error when it cannot be read."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as error:
        raise SecretUnreadable(
            f"The stored {what} cannot be decrypted (SECRET_KEY or CLUSTER_SECRETS_KEY changed); "
            "register the cluster again."
        ) from error
