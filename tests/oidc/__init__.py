"""The test identity provider (provider.mjs, a real oidc-provider) and the fixtures that start it."""
