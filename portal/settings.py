"""Settings of the GPU portal, read only from the environment (and `.env`).

Defaults run the demo on a laptop; production sets `DEBUG=false`, which turns
every secure default on and makes `SECRET_KEY` mandatory.
"""

from decimal import Decimal
from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _
from django_guid.integrations import CeleryIntegration

from portal import logs, startup

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
# What-if runs (minutes each) wait on a queue of their own, never ahead of provisioning, syncs or alerts; the
# workers of deploy/kubernetes/whatif-worker-deployment.yaml and ./scripts/run consume it, the others not.
WHATIF_QUEUE = env.str("WHATIF_QUEUE", default="whatif")
CELERY_TASK_ROUTES = {"pools.tasks.execute_whatif_run": {"queue": WHATIF_QUEUE}}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "sync-clusters": {
        "task": "pools.tasks.sync_all_clusters",
        "schedule": env.int("CAPACITY_SYNC_SECONDS", default=60),
    },
    "admit-waiting-requests": {
        "task": "pools.tasks.admit_waiting_requests",
        "schedule": env.int("QUEUE_RUN_SECONDS", default=60),
    },
    "sweep-stuck-pools": {  # POOL_REDRIVE_SECONDS, POOL_STUCK_SECONDS and WHATIF_RUN_SECONDS, under Capacity
        "task": "pools.tasks.sweep_stuck_pools",
        "schedule": env.int("POOL_SWEEP_SECONDS", default=60),
    },
    "meter-usage": {  # meters every ended period not metered yet (METERING_PERIOD_SECONDS, under Billing)
        "task": "billing.tasks.meter_usage",
        "schedule": env.int("METERING_RUN_SECONDS", default=300),
    },
    "collect-gpu-figures": {  # the simulated fleet and clusters with a Prometheus URL (under Monitoring)
        "task": "monitoring.tasks.collect",
        "schedule": env.int("MONITORING_COLLECT_SECONDS", default=30),
    },
    "roll-up-gpu-samples": {
        "task": "monitoring.tasks.roll_up_samples",
        "schedule": 60,
    },
    "prune-gpu-samples": {  # drops days past MONITORING_RAW_DAYS, makes the next days' partitions
        "task": "monitoring.tasks.prune_samples",
        "schedule": crontab(minute=7),
    },
    "evaluate-alerts": {  # MONITORING_ALERT_* under Monitoring
        "task": "monitoring.tasks.evaluate_alerts",
        "schedule": 60,
    },
    "deliver-alert-notifications": {  # retries fall due between runs
        "task": "monitoring.tasks.deliver_alert_notifications",
        "schedule": 30,
    },
    "clear-expired-sessions": {
        "task": "portal.tasks.clear_expired_sessions",
        "schedule": crontab(minute=17, hour=3),
    },
}

# --- E-mail -------------------------------------------------------------------

# EMAIL_URL: smtp://user:password@host:587/?tls=True, consolemail://, filemail:///path
globals().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="GPU Portal <gpu-portal@localhost>")
SERVER_EMAIL = env.str("SERVER_EMAIL", default=DEFAULT_FROM_EMAIL)
EMAIL_SUBJECT_PREFIX = "[GPU Portal] "

# --- Capacity -----------------------------------------------------------------

# Encrypts stored kubeconfigs; derived from SECRET_KEY when empty.
CLUSTER_SECRETS_KEY = env.str("CLUSTER_SECRETS_KEY", default="")
CAPACITY_SYNC_SECONDS = env.int("CAPACITY_SYNC_SECONDS", default=60)
# A sync that finds nothing new writes nothing, except "last seen" times at most this often.
SYNC_HEARTBEAT_SECONDS = env.int("SYNC_HEARTBEAT_SECONDS", default=600)
# A failing cluster is retried after CAPACITY_SYNC_SECONDS × 2^failures, capped here.
SYNC_BACKOFF_MAX_SECONDS = env.int("SYNC_BACKOFF_MAX_SECONDS", default=1800)
# How often provisioning looks at a MIG change under way.
PROVISION_POLL_SECONDS = env.float("PROVISION_POLL_SECONDS", default=5.0)
# How long a node may stay in MIG state "pending" before a change counts as failed.
MIG_PENDING_TIMEOUT_SECONDS = env.int("MIG_PENDING_TIMEOUT_SECONDS", default=600)
# Deadlines of a pool in `provisioning` (counted from its reservation) or `releasing` (from the
# release): past POOL_REDRIVE_SECONDS the sweeper enqueues its task again (at most once per that
# period; the task is safe to repeat); past POOL_STUCK_SECONDS it fails the pool (capacity
# returned, tenant told) or closes the release (released, quota change given up), saying why.
# The first comes after MIG_PENDING_TIMEOUT_SECONDS, so a slow MIG change is failed by its own
# deadline first; the sweeper runs every POOL_SWEEP_SECONDS.
POOL_REDRIVE_SECONDS = env.int("POOL_REDRIVE_SECONDS", default=MIG_PENDING_TIMEOUT_SECONDS + 300)
POOL_STUCK_SECONDS = env.int("POOL_STUCK_SECONDS", default=2 * POOL_REDRIVE_SECONDS)
POOL_SWEEP_SECONDS = env.int("POOL_SWEEP_SECONDS", default=60)
# A blocked request that has waited this long stops smaller ones behind it from backfilling.
QUEUE_BACKFILL_GRACE_SECONDS = env.int("QUEUE_BACKFILL_GRACE_SECONDS", default=1800)
# Requests approved this far back are the recent demand the queue tells placement, each counting less the
# older it is (half every half window): re-partitioned GPUs get layouts for what is being asked. The what-if
# simulator weighs its trace the same way (pools/placement/demand.py).
QUEUE_DEMAND_WINDOW_SECONDS = env.int("QUEUE_DEMAND_WINDOW_SECONDS", default=7 * 24 * 3600)
# How long a process may reuse its picture of the fleet (availability for the request form and the
# specs API) while no change of capacity has been seen; 0 rebuilds it on every read.
CAPACITY_PICTURE_SECONDS = env.int("CAPACITY_PICTURE_SECONDS", default=30)
# /readyz calls a cluster behind (degraded, still ready) when its last sync is older than this; 0: the
# heartbeat (SYNC_HEARTBEAT_SECONDS) plus three sync periods (pools/selectors/readiness.py).
SYNC_STALE_SECONDS = env.int("SYNC_STALE_SECONDS", default=0)
# A what-if run kept for the operators' page (pools/services/whatif_runs.py) must start within this many
# seconds of being asked for, and finish within as many of starting; past either deadline the sweeper
# (POOL_SWEEP_SECONDS) fails it, and the worker stops a run that overstays it.
WHATIF_RUN_SECONDS = env.int("WHATIF_RUN_SECONDS", default=1800)
# The most GPUs a what-if run's changed fleet may hold at any step of its changes: four times the 8,000-GPU
# fleet the benchmarks take as large. A larger one is refused when asked for, before anything is queued.
WHATIF_MAX_GPUS = env.int("WHATIF_MAX_GPUS", default=32_000)
# The most what-if runs queued or running at once, whoever asked (each person one at a time): the what-if
# workers' concurrency (deploy/kubernetes/whatif-worker-deployment.yaml), so that none waits its deadline out.
WHATIF_MAX_RUNNING = env.int("WHATIF_MAX_RUNNING", default=2)
# The simulated GPU Operator's delay between a layout change and its success.
SIMULATED_MIG_APPLY_SECONDS = env.float("SIMULATED_MIG_APPLY_SECONDS", default=8.0)

# --- Billing --------------------------------------------------------------------

# Every price, usage record and invoice is in this currency (ISO 4217).
BILLING_CURRENCY = env.str("BILLING_CURRENCY", default="KRW")
# Months of invoices are calendar months in this time zone.
BILLING_TIME_ZONE = env.str("BILLING_TIME_ZONE", default="Asia/Seoul")
# The font of invoice PDFs, with a CJK font so that Hangul prints; in a .ttc collection, the index of
# the face (Noto Sans CJK: 1 is Korean).
BILLING_PDF_FONT = env.str(
    "BILLING_PDF_FONT", default="/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"
)
BILLING_PDF_FONT_INDEX = env.int("BILLING_PDF_FONT_INDEX", default=1)
# Tax (percent) on an invoice whose tenant's billing profile names no rate of its own.
BILLING_TAX_RATE = Decimal(env.str("BILLING_TAX_RATE", default="10"))
# An issued invoice not paid this many days after it was issued is overdue.
BILLING_PAYMENT_DAYS = env.int("BILLING_PAYMENT_DAYS", default=30)
# Metering cuts time into periods of this many seconds (UTC, from the epoch) and meters a period
# METERING_DELAY_SECONDS after it ends, when no release or admission can still land inside it.
METERING_PERIOD_SECONDS = env.int("METERING_PERIOD_SECONDS", default=3600)
METERING_DELAY_SECONDS = env.int("METERING_DELAY_SECONDS", default=60)

# --- Monitoring -----------------------------------------------------------------

# How long each form of GPU figures is kept: raw samples (whole days, dropped as partitions), 5-minute and
# 1-hour roll-ups (min / avg / max).
MONITORING_RAW_DAYS = env.int("MONITORING_RAW_DAYS", default=3)
MONITORING_5M_DAYS = env.int("MONITORING_5M_DAYS", default=35)
MONITORING_1H_DAYS = env.int("MONITORING_1H_DAYS", default=400)
# Samples are refused when older than this (an agent's buffer holds at most about this much) or more than
# MONITORING_SAMPLE_MAX_AHEAD_SECONDS in the future (a host's clock gone wrong).
MONITORING_SAMPLE_MAX_AGE_SECONDS = env.int("MONITORING_SAMPLE_MAX_AGE_SECONDS", default=6 * 3600)
MONITORING_SAMPLE_MAX_AHEAD_SECONDS = env.int("MONITORING_SAMPLE_MAX_AHEAD_SECONDS", default=300)
# The most readings (hosts × instants) and GPUs one batch from an agent may carry.
MONITORING_BATCH_MAX_READINGS = env.int("MONITORING_BATCH_MAX_READINGS", default=1000)
MONITORING_BATCH_MAX_GPUS = env.int("MONITORING_BATCH_MAX_GPUS", default=20000)
# How often the portal itself collects: the simulated fleet, and clusters with a Prometheus URL.
MONITORING_COLLECT_SECONDS = env.int("MONITORING_COLLECT_SECONDS", default=30)
MONITORING_PROMETHEUS_TIMEOUT_SECONDS = env.float("MONITORING_PROMETHEUS_TIMEOUT_SECONDS", default=5.0)
# The simulated fleet has an uncorrected ECC error on a GPU with a chance of one in this many per minute
# (about one a day on the demo's fleet), which drains that GPU as a real one would be.
MONITORING_SIMULATED_ECC_ONE_IN = env.int("MONITORING_SIMULATED_ECC_ONE_IN", default=150000)
# Alerts: a threshold holds over a duration when the samples in it are never further apart than
# MONITORING_ALERT_SAMPLE_GAP_SECONDS (nor further from its ends). Notifications go by e-mail to the operators
# and as a JSON POST to MONITORING_ALERT_WEBHOOK_URL (if set; a rule may name another webhook as well), each
# retried after MONITORING_ALERT_RETRY_SECONDS, doubling up to MONITORING_ALERT_RETRY_MAX_SECONDS, until
# MONITORING_ALERT_MAX_ATTEMPTS tries have failed.
MONITORING_ALERT_SAMPLE_GAP_SECONDS = env.int("MONITORING_ALERT_SAMPLE_GAP_SECONDS", default=120)
MONITORING_ALERT_WEBHOOK_URL = env.str("MONITORING_ALERT_WEBHOOK_URL", default="")
MONITORING_ALERT_WEBHOOK_TIMEOUT_SECONDS = env.float("MONITORING_ALERT_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
MONITORING_ALERT_RETRY_SECONDS = env.int("MONITORING_ALERT_RETRY_SECONDS", default=30)
MONITORING_ALERT_RETRY_MAX_SECONDS = env.int("MONITORING_ALERT_RETRY_MAX_SECONDS", default=3600)
MONITORING_ALERT_MAX_ATTEMPTS = env.int("MONITORING_ALERT_MAX_ATTEMPTS", default=10)
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
# else; the demo (DEBUG) lets them in without it.
STAFF_REQUIRE_TOTP = env.bool("STAFF_REQUIRE_TOTP", default=not DEBUG)

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
        "CLUSTER_SECRETS_KEY": CLUSTER_SECRETS_KEY,
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
        "form-action": ["'self'"],
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
