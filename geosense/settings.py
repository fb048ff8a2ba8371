"""GeoSense settings: everything that differs between machines comes from the environment.

The environment is the process's own, completed by the local `.env` file that `make run`
writes on its first run (`geosense/envfile.py`): a real variable always wins over the file.
`.env.example` lists every variable read here.
"""

import json
import os
import re
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from geosense.envfile import env_file_load

BASE_DIR = Path(__file__).resolve().parent.parent

env_file_load()


def _env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DEBUG")

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "dev-only-insecure-secret-key-never-use-in-production"

ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()
] or (["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "geosense.accounts",
    "geosense.annotations",
    "tools",
    "chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "geosense.jsonapi.ApiJsonErrorsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "geosense.accounts.middleware.BearerTokenMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "geosense.urls"
ASGI_APPLICATION = "geosense.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "sqlite:///db.sqlite3"),
        # No persistent connections, as Django advises under ASGI: a connection belongs to a
        # thread, and the threads that run ORM work for requests and turn tasks outlive them,
        # so a kept connection would be reused by whoever runs there next with nothing
        # checking its age. Each request opens one and closes it at its end; code that goes
        # through `database_sync_to_async` also closes it around each call.
        conn_max_age=0,
        # Checked before reuse. With conn_max_age=0 it costs nothing (nothing is reused);
        # it is on so that raising conn_max_age can never hand out a dead connection.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A relative SQLite path (`sqlite:///db.sqlite3`, as in `.env`) is relative to the
    # repository root, wherever a command is started from.
    if DATABASES["default"]["NAME"] != ":memory:":
        DATABASES["default"]["NAME"] = str(BASE_DIR / DATABASES["default"]["NAME"])
    # Daphne, the turn tasks and test processes write the same file: WAL, a busy timeout and
    # IMMEDIATE transactions keep them from failing with "database is locked".
    # The WAL is checkpointed into the file once it holds 10,000 pages (~40 MiB) rather than
    # SQLite's 1,000: a checkpoint runs in the commit that crosses the mark, on the engine's
    # one database thread, and waits for its fsyncs there while every turn's trips queue.
    # A turn writes ~27 pages, mostly the same few again (a session's row, the messages'
    # last pages), so a checkpoint ten times rarer copies far fewer pages than ten: at 200
    # users, 23-32 fsyncs and 0.4-0.5 s of them in a 20-s run instead of 146-250 and 0.6-1.4 s
    # (docs/benchmarks.md, session 31).
    DATABASES["default"]["OPTIONS"] = {
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=10000;"
        ),
        # Seconds a write waits for another writer before "database is locked".
        "timeout": float(os.environ.get("GEOSENSE_SQLITE_BUSY_TIMEOUT", "") or 20),
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "geosense.layers.InMemoryChannelLayer"}}
# Rate limits count in the cache (geosense/throttle.py): shared by every process through Redis
# when there is one, in each process's memory otherwise.
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

# Under /api/ a failed CSRF check answers JSON (401 for an anonymous write), elsewhere HTML.
CSRF_FAILURE_VIEW = "geosense.jsonapi.csrf_failure"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/chat/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where `collectstatic` gathers the files the proxy serves at /static/ (relative: to the checkout).
STATIC_ROOT = BASE_DIR / (os.environ.get("STATIC_ROOT") or "staticfiles")

# Request bodies of the JSON API are small; a larger one is refused before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024


# --- Security (docs/security.md) ------------------------------------------------------------
# HTTPS is the proxy's job; these say what the app does about it, from the environment. The
# production values are in the README and docs/deploy.md; `manage.py check --deploy` is clean
# with them (tests/security/test_deploy_settings.py).
def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """`X-Forwarded-Proto,https` (or Django's `HTTP_X_FORWARDED_PROTO,https`) as Django's pair."""
    if not raw.strip():
        return None
    header, _, value = (part.strip() for part in raw.partition(","))
    if not header or not value:
        raise ImproperlyConfigured(
            "SECURE_PROXY_SSL_HEADER must be HEADER,VALUE, e.g. X-Forwarded-Proto,https."
        )
    name = header.upper().replace("-", "_")
    return (name if name.startswith("HTTP_") else f"HTTP_{name}", value)


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT")
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0") or 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = _env_bool("SESSION_COOKIE_SECURE")
CSRF_COOKIE_SECURE = _env_bool("CSRF_COOKIE_SECURE")
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# The Content-Security-Policy of every HTTP answer, static files included (geosense/headers.py
# adds it in the ASGI application). One directive per key, its sources in a list: a feature
# that needs more extends a list here (the WebGL map, for instance, "worker-src": "blob:").
# No inline script anywhere: every script is a file under static/.
GEOSENSE_CSP: dict[str, list[str]] = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:", "blob:"],
    "font-src": ["'self'"],
    # 'self' covers the session socket (ws:/wss: of this host) and the app's own tiles.
    "connect-src": ["'self'"],
    "worker-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

# --- GeoSense -------------------------------------------------------------------------------
_llm_base_url = os.environ.get("GEOSENSE_LLM_BASE_URL", "")
GEOSENSE_AGENT = os.environ.get("GEOSENSE_AGENT") or ("openai" if _llm_base_url else "local")
if GEOSENSE_AGENT not in {"local", "openai"}:
    raise ImproperlyConfigured("GEOSENSE_AGENT must be 'local' or 'openai'.")
GEOSENSE_LLM_BASE_URL = _llm_base_url
GEOSENSE_LLM_MODEL = os.environ.get("GEOSENSE_LLM_MODEL", "")
GEOSENSE_LLM_API_KEY = os.environ.get("GEOSENSE_LLM_API_KEY", "")


def _env_number(name: str, kind: type, *, low: float, high: float | None = None) -> Any:
    """An optional number from the environment, refused at start-up when it is out of range."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name} must be {what}, not {raw!r}.") from None
    if value < low or (high is not None and value > high):
        limits = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ImproperlyConfigured(f"{name} must be {limits}, not {raw!r}.")
    return value


def _env_headers(name: str) -> dict[str, str]:
    """Extra HTTP headers as a JSON object of names to string values."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        headers = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} is not valid JSON.") from None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str)
        and _HEADER_NAME_RE.fullmatch(k)
        and isinstance(v, str)
        and not _HEADER_BREAK_RE.search(v)
        for k, v in headers.items()
    ):
        raise ImproperlyConfigured(
            f'{name} must be a JSON object of header names to text values, e.g. {{"api-key": "…"}}.'
        )
    return headers


_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_BREAK_RE = re.compile(r"[\r\n\x00]")
GEOSENSE_LLM_HEADERS = _env_headers("GEOSENSE_LLM_HEADERS")
GEOSENSE_LLM_TEMPERATURE = _env_number("GEOSENSE_LLM_TEMPERATURE", float, low=0, high=2)
GEOSENSE_LLM_MAX_TOKENS = _env_number("GEOSENSE_LLM_MAX_TOKENS", int, low=1)
# Seconds to connect to the model server (each attempt), to the first bytes of its answer (from
# the request's start, retries included; GEOSENSE_LLM_TIMEOUT is this setting's older name) and
# of silence once the answer streams (a stall ends the turn, the text shown is kept).
GEOSENSE_LLM_CONNECT_TIMEOUT = _env_number("GEOSENSE_LLM_CONNECT_TIMEOUT", float, low=0.1) or 10.0
GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = (
    _env_number("GEOSENSE_LLM_FIRST_BYTE_TIMEOUT", float, low=0.1)
    or _env_number("GEOSENSE_LLM_TIMEOUT", float, low=1)
    or 60.0
)
GEOSENSE_LLM_CHUNK_TIMEOUT = _env_number("GEOSENSE_LLM_CHUNK_TIMEOUT", float, low=0.1) or 30.0
GEOSENSE_LLM_TOOL_CHOICE = os.environ.get("GEOSENSE_LLM_TOOL_CHOICE", "").strip() or None
if GEOSENSE_LLM_TOOL_CHOICE is not None and not re.fullmatch(
    r"auto|none|required|[A-Za-z0-9_-]{1,64}", GEOSENSE_LLM_TOOL_CHOICE
):
    raise ImproperlyConfigured(
        "GEOSENSE_LLM_TOOL_CHOICE must be auto, none, required or the name of a tool."
    )
# Image contexts go to the model as image parts; off (or after the server refuses images once):
# a short text description instead (docs/models.md, "Images").
GEOSENSE_LLM_VISION = _env_bool("GEOSENSE_LLM_VISION", default=True)
# The model's context window (an estimate of tokens): the oldest whole turns are left out of a
# request to fit (docs/models.md, "Long conversations").
GEOSENSE_LLM_CONTEXT_TOKENS = _env_number("GEOSENSE_LLM_CONTEXT_TOKENS", int, low=1024) or 32_000
# Credits charged per 1,000 model tokens of a turn, through the credit ledger; 0: free.
GEOSENSE_CREDITS_PER_1K_TOKENS = (
    _env_number("GEOSENSE_CREDITS_PER_1K_TOKENS", float, low=0, high=1_000_000) or 0.0
)
GEOSENSE_CLIENT_TOOL_TIMEOUT = float(os.environ.get("GEOSENSE_CLIENT_TOOL_TIMEOUT", "30"))
# Build the in-process spatial index (and the tiles' shapes) as the process starts, in a thread,
# so that the first question or map after a start does not wait for it (geosense/annotations/
# index.py); off: on first use.
GEOSENSE_INDEX_WARM = _env_bool("GEOSENSE_INDEX_WARM", default=True)
# What answers within-distance, overlap, nearest, similarity and class counts: "auto" (PostGIS on
# PostgreSQL, the in-process index elsewhere), "index" or "postgis" (geosense/annotations/
# spatial.py). With PostGIS no process builds the index, so GEOSENSE_INDEX_WARM does nothing.
GEOSENSE_SPATIAL_BACKEND = os.environ.get("GEOSENSE_SPATIAL_BACKEND", "auto").strip() or "auto"
if GEOSENSE_SPATIAL_BACKEND not in {"auto", "index", "postgis"}:
    raise ImproperlyConfigured("GEOSENSE_SPATIAL_BACKEND must be auto, index or postgis.")
# Threads (and so database connections) the turn engine's ORM work shares in one process, however
# many turns run (geosense/dbpool.py). SQLite takes one writer at a time: one thread, which never
# waits for the file's lock; PostgreSQL: a few.
GEOSENSE_DB_THREADS = _env_number("GEOSENSE_DB_THREADS", int, low=1, high=64) or (
    1 if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" else 4
)
# Seconds a turn's claim on its session lasts unless renewed (a running turn renews it every
# quarter): after a crash, the session takes a new turn at most this long after the last renewal.
GEOSENSE_TURN_LEASE = float(os.environ.get("GEOSENSE_TURN_LEASE", "120"))
if GEOSENSE_TURN_LEASE < 2:
    raise ImproperlyConfigured("GEOSENSE_TURN_LEASE must be at least 2 seconds.")
# Seconds between a process's heartbeats (chat/processes.py); a process silent for
# GEOSENSE_PROCESS_STALE seconds is dead: its turn claims and socket registrations are taken
# over, so after a crash a session takes a new turn within seconds. 0 turns heartbeats off
# (the test process): claims then last their lease and registrations until their socket closes.
GEOSENSE_PROCESS_HEARTBEAT = float(os.environ.get("GEOSENSE_PROCESS_HEARTBEAT", "1"))
GEOSENSE_PROCESS_STALE = float(os.environ.get("GEOSENSE_PROCESS_STALE", "4"))
if GEOSENSE_PROCESS_HEARTBEAT < 0 or (
    GEOSENSE_PROCESS_HEARTBEAT and GEOSENSE_PROCESS_STALE < 2 * GEOSENSE_PROCESS_HEARTBEAT
):
    raise ImproperlyConfigured(
        "GEOSENSE_PROCESS_HEARTBEAT must be 0 (off) or positive, and GEOSENSE_PROCESS_STALE at "
        "least twice as long."
    )
GEOSENSE_MAP_TILE_URL = os.environ.get("GEOSENSE_MAP_TILE_URL", "")
if GEOSENSE_MAP_TILE_URL.startswith(("https://", "http://")):
    # A base map from another host: its origin may be fetched and shown.
    _tile_origin = "/".join(GEOSENSE_MAP_TILE_URL.split("/", 3)[:3])
    GEOSENSE_CSP["img-src"].append(_tile_origin)
    GEOSENSE_CSP["connect-src"].append(_tile_origin)
# The local superuser `make run` keeps (`manage.py local_admin`, DEBUG only); `.env` holds it.
GEOSENSE_ADMIN_USERNAME = os.environ.get("GEOSENSE_ADMIN_USERNAME", "admin")
GEOSENSE_ADMIN_PASSWORD = os.environ.get("GEOSENSE_ADMIN_PASSWORD", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}
