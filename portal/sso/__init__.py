"""Single sign-on through OpenID Connect, on django-allauth's OpenID Connect provider.

Words used here:
- provider: an identity provider the platform trusts (Keycloak, Entra ID, Okta, Google), configured from
  the environment (`config.py`); each has an id (`oidc` for the one of `OIDC_ISSUER`), a name on the sign-in
  button, an issuer, a client id and secret, the claim that carries its groups and the `acr` values that
  mean a second factor was used.
- ID token: what the provider says of the person, signed. It is accepted only from the configured issuer, for
  this client, unexpired, with a signature that verifies against the provider's published keys, and
  carrying the nonce this sign-in sent (`provider.py`); the sign-in's state is good once (allauth keeps it in
  the session and drops it when used).
- groups: the provider's group claim, a list of strings; the platform maps groups to roles (`GroupRole`), and
  each sign-in applies them (`roles.py`).

Modules: `config.py` (settings from the environment), `provider.py` (the provider and the checks of its
tokens), `adapter.py` (who may sign in, and as whom), `roles.py` (groups to roles), `session.py` (a second
factor at the provider, signing out there), `errors.py` (the refusals a person reads).
"""
