"""Settings of the GPU portal, read only from the environment (and `.env`).

Defaults run the demo on a laptop; production sets `DEBUG=false`, which turns
every secure default on and makes `SECRET_KEY` mandatory.
"""

import os
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _
from django_guid.integrations import CeleryIntegration

from portal import logs, startup
from portal.sso.config import ProviderConfigError, provider_apps, provider_origins

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DEBUG", default=False)

SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. With DEBUG=false the portal refuses to start "
            "without one: set SECRET_KEY in the environment or in .env to a long "
            "random string, e.g. the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
        )
    SECRET_KEY = "insecure-development-key-used-only-with-DEBUG-true"

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Absolute address of the portal, used in links sent by e-mail.
PORTAL_BASE_URL = env.str("PORTAL_BASE_URL", default="http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "allauth",
    "allauth.account",
    "allauth.mfa",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_guid",
    "portal",
    "pools",
    "billing",
    "monitoring",
]

MIDDLEWARE = [
    # Probes first: they come by a pod's address over plain HTTP (portal/health.py).
    "portal.health.HealthMiddleware",
    # With METRICS_PORT, that port's connections get /metrics and nothing else (portal/telemetry.py).
    "portal.telemetry.MetricsPortMiddleware",
    "django_guid.middleware.guid_middleware",
    "portal.telemetry.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A node agent's POST is served here, without the rest (portal/middleware.py).
    "portal.middleware.BareViewMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "portal.middleware.BadInputMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "portal.middleware.StaffTwoFactorMiddleware",
    "portal.middleware.RefusalMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.portal",
            ],
        },
    },
]

# --- Services -----------------------------------------------------------------

DATABASES = {
    "default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/portal"),
}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env.str("CACHE_URL", default=REDIS_URL),
        "KEY_PREFIX": "portal",
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_QUEUE", default="portal")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
# Each app declares its periodic tasks and the tasks on queues of their own in its plugin
# (portal/shell.py: Periodic, Route); portal/celery.py reads them.

# --- E-mail -------------------------------------------------------------------

# EMAIL_URL: smtp://user:password@host:587/?tls=True, consolemail://, filemail:///path
globals().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="GPU Portal <gpu-portal@localhost>")
SERVER_EMAIL = env.str("SERVER_EMAIL", default=DEFAULT_FROM_EMAIL)
EMAIL_SUBJECT_PREFIX = "[GPU Portal] "

# --- Each app's own ---------------------------------------------------------------

# Each app declares its settings with their defaults in its own `conf.py` (pools/conf.py, billing/conf.py,
# monitoring/conf.py), read from the environment like these (portal/appsettings.py).

# --- Metrics ---------------------------------------------------------------------

# /metrics answers a request bearing this token (Authorization: Bearer …), or one coming from these networks
# while no proxy is trusted (TRUSTED_PROXY_COUNT 0): behind a proxy only the token opens it, and the portal
# refuses to start without one.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.1/32", "::1/128"])
# With a port here the web serves /metrics on that port only (deploy/gunicorn.conf.py listens on it too), and
# nothing else there, so that a Service of its own reaches the figures and the public one never does; 0
# serves /metrics beside the pages.
METRICS_PORT = env.int("METRICS_PORT", default=0)

# --- Outbound requests ----------------------------------------------------------

# Alert webhooks and clusters' Prometheus are reached only at public addresses (portal/outbound.py):
# loopback, link-local, private and reserved ones are refused, besides the networks (CIDR) listed in
# OUTBOUND_ALLOWED_NETWORKS, or all of them with OUTBOUND_ALLOW_PRIVATE_NETWORKS.
OUTBOUND_ALLOW_PRIVATE_NETWORKS = env.bool("OUTBOUND_ALLOW_PRIVATE_NETWORKS", default=False)
OUTBOUND_ALLOWED_NETWORKS = env.list("OUTBOUND_ALLOWED_NETWORKS", default=[])

# --- Accounts -----------------------------------------------------------------

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "home"

ACCOUNT_ADAPTER = "portal.adapters.AccountAdapter"
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "username*", "password1*", "password2*"]
ACCOUNT_UNIQUE_EMAIL = True
# none | optional | mandatory
ACCOUNT_EMAIL_VERIFICATION = env.str("ACCOUNT_EMAIL_VERIFICATION", default="optional")
ACCOUNT_EMAIL_SUBJECT_PREFIX = EMAIL_SUBJECT_PREFIX
# Invitation-only by default: an open portal would let anyone create accounts.
PORTAL_OPEN_SIGNUP = env.bool("PORTAL_OPEN_SIGNUP", default=False)
INVITATION_VALID_DAYS = env.int("INVITATION_VALID_DAYS", default=14)

MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = env.str("MFA_TOTP_ISSUER", default="GPU Portal")
# The two-factor steps count each code into the account's lock-out, as the token API does.
MFA_FORMS = {
    "authenticate": "portal.forms.AuthenticateForm",
    "reauthenticate": "portal.forms.ReauthenticateForm",
}
# Platform staff (approvers, operators, finance, superusers) must turn on TOTP before anything
# else; the demo (DEBUG) lets them in without it. A sign-in through an identity provider that says it
# used a second factor (portal/sso/session.py) counts as one.
STAFF_REQUIRE_TOTP = env.bool("STAFF_REQUIRE_TOTP", default=not DEBUG)

# Single sign-on through OpenID Connect (portal/sso/): OIDC_ISSUER, OIDC_CLIENT_ID, OIDC_CLIENT_SECRET for
# one provider, OIDC_PROVIDERS (JSON) for more; see portal/sso/config.py and the README.
try:
    _oidc_apps = provider_apps(os.environ)
except ProviderConfigError as error:
    raise ImproperlyConfigured(str(error)) from None
SOCIALACCOUNT_PROVIDERS = {
    "openid_connect": {
        "provider_class": "portal.sso.provider.Provider",
        "OAUTH_PKCE_ENABLED": True,
        "APPS": _oidc_apps,
    }
}
SOCIALACCOUNT_ADAPTER = "portal.sso.adapter.SocialAccountAdapter"
# A sign-in through a provider starts with a POST from the sign-in page, never from a link alone.
SOCIALACCOUNT_LOGIN_ON_GET = False
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_STORE_TOKENS = False
# Accounts are matched by address in portal/sso/adapter.py, and only through addresses both sides verified.
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
# With LOCAL_PASSWORDS false, only superusers may sign in with a password; everyone else signs in through an
# identity provider.
LOCAL_PASSWORDS = env.bool("LOCAL_PASSWORDS", default=True)

# How many proxies in front of the portal append to X-Forwarded-For; 0 trusts the header not at
# all. Throttles and the sign-in lock-out key on the client address this yields.
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
ALLAUTH_TRUSTED_PROXY_COUNT = TRUSTED_PROXY_COUNT
# Failed sign-ins, counted per account across the sign-in form, the admin and the token API:
# after LOGIN_FAILURES_LIMIT within LOGIN_LOCKOUT_SECONDS the account is locked for the rest of
# that window; 10 failures a minute from one address lock that address.
LOGIN_FAILURES_LIMIT = env.int("LOGIN_FAILURES_LIMIT", default=5)
LOGIN_LOCKOUT_SECONDS = env.int("LOGIN_LOCKOUT_SECONDS", default=300)
ACCOUNT_RATE_LIMITS = {"login_failed": f"10/m/ip,{LOGIN_FAILURES_LIMIT}/{LOGIN_LOCKOUT_SECONDS}s/key"}
ACCOUNT_FORMS = {"signup": "portal.forms.SignupForm"}

# API tokens: days a new token lives (0: until revoked), and how many live tokens one person keeps
# (issuing one more revokes the oldest).
API_TOKEN_TTL_DAYS = env.int("API_TOKEN_TTL_DAYS", default=0)
API_TOKENS_PER_USER = env.int("API_TOKENS_PER_USER", default=20)

# --- Namespaces ---------------------------------------------------------------

# A project's namespace is always `<tenant>-<suffix>`; these (shell-style patterns) are never given
# out. The portal's own namespace is added to them.
RESERVED_NAMESPACES = env.list(
    "RESERVED_NAMESPACES",
    default=[
        "default",
        "kube-*",
        "gpu-operator",
        "gpu-operator-*",
        "nvidia-*",
        "monitoring",
        "cert-manager",
        "ingress-*",
        "openshift",
        "openshift-*",
    ],
)
PORTAL_NAMESPACE = env.str("PORTAL_NAMESPACE", default="gpu-portal")

# --- API ----------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Every list is paged: `?limit=` (50 unless given, at most 500) and `?offset=`, in an envelope
    # {count, next, previous, results}.
    "DEFAULT_PAGINATION_CLASS": "portal.pagination.LimitOffsetPagination",
    "DEFAULT_PARSER_CLASSES": [
        "portal.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "portal.openapi.PortalAutoSchema",
    "EXCEPTION_HANDLER": "portal.errors.api_exception_handler",
    # JSON only: the browsable API's HTML pages are for development, where DEBUG shows them.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "DEFAULT_THROTTLE_RATES": {
        "auth": env.str("AUTH_THROTTLE_RATE", default="30/minute"),
        "auth-account": env.str("AUTH_ACCOUNT_THROTTLE_RATE", default="10/minute"),
    },
    # The client address is REMOTE_ADDR unless trusted proxies in front add X-Forwarded-For.
    "NUM_PROXIES": TRUSTED_PROXY_COUNT,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Projects, GPU pools, capacity, usage and invoices of the GPU portal.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies as components of their own: read-only fields left out, blank strings refused where
    # the serializer refuses them.
    "COMPONENT_SPLIT_REQUEST": True,
    # What the server refuses in any request (NUL, over-long query values), said on every string.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.openapi.requests_as_enforced",
    ],
    # The API speaks JSON: form bodies are accepted for the browsable API, not offered to clients.
    "PARSER_WHITELIST": ["portal.parsers.JSONParser"],
    # Requests and pools both have a `state`: each its own enum, not one name for two sets of values.
    "ENUM_NAME_OVERRIDES": {
        "PoolRequestStateEnum": "pools.models.pools.RequestState",
        "PoolStateEnum": "pools.models.pools.PoolState",
    },
}

# --- Internationalisation -----------------------------------------------------

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("ko", _("Korean"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

# --- Static files: served by the app, never by a CDN ---------------------------

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Security: secure unless DEBUG, each switch overridable ----------------------

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
if env.bool("BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"
# A failed CSRF check under /api/ answers JSON like every other API error.
CSRF_FAILURE_VIEW = "portal.errors.csrf_failure"
SESSION_COOKIE_HTTPONLY = True
# No process starts with a placeholder secret of the shipped examples, nor behind a proxy without a
# metrics token (portal/startup.py).
startup.refuse_placeholders(
    {
        "SECRET_KEY": SECRET_KEY,
        "CLUSTER_SECRETS_KEY": env.str("CLUSTER_SECRETS_KEY", default=""),  # pools/conf.py reads it
        "METRICS_TOKEN": METRICS_TOKEN,
        **{name: env.str(name, default="") for name in startup.ADDRESSES},
    }
)
startup.refuse_open_metrics(token=METRICS_TOKEN, trusted_proxies=TRUSTED_PROXY_COUNT)

# --- Content-Security-Policy and browser hardening ---

# Every script and style is a file the portal serves itself: nothing inline, nothing from
# another host, so the portal works offline and injected markup cannot run.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],  # the TOTP QR code of two-factor setup is a data: image
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        # A sign-in or sign-out through an identity provider goes on to it from the portal's own form.
        "form-action": ["'self'", *provider_origins(_oidc_apps)],
        "frame-ancestors": ["'none'"],
    },
}
# Addresses carry tenant and project names and invitation tokens; another site needs none of
# them, and the portal gains nothing from telling it, so only same-origin requests get a referrer.
SECURE_REFERRER_POLICY = "same-origin"

# --- Logs and request ids ---------------------------------------------------------

# `text` for a terminal, `json` (one object a line) for a log pipeline; see portal/logs.py.
LOGGING = logs.config(
    log_format=env.str("LOG_FORMAT", default="text"), level=env.str("LOG_LEVEL", default="INFO")
)
# A request keeps the id a proxy gave it in X-Request-ID (when well-formed) or gets one; the answer says it,
# and the tasks it sends carry it to the worker's log lines.
DJANGO_GUID = {
    "GUID_HEADER_NAME": "X-Request-ID",
    "INTEGRATIONS": [CeleryIntegration(use_django_logging=False, log_parent=False)],
}
