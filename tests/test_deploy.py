"""The deployment files agree with the app and with each other.

No Docker engine runs here, so compose.yaml is checked by parsing it and comparing what it sets
with what the app reads; nginx checks the nginx files itself in tests/scale/test_proxy.py.
"""

import configparser
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import yaml
from django.conf import settings

from geosense.headers import csp_header
from tests.setup.test_env_example import documented

BASE_DIR = Path(__file__).resolve().parents[1]
DEPLOY = BASE_DIR / "deploy"
# Variables of the images themselves, not GeoSense's.
IMAGE_VARIABLES = {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD"}


def compose() -> dict:
    return yaml.safe_load((BASE_DIR / "compose.yaml").read_text())


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def env_file(path: Path) -> dict[str, str]:
    pairs = re.findall(r"(?m)^([A-Z][A-Z0-9_]*)=(.*)$", path.read_text())
    return dict(pairs)


def test_compose_runs_postgis_redis_a_migration_the_web_processes_and_nginx():
    services = compose()["services"]

    assert set(services) == {"db", "redis", "migrate", "web", "nginx"}
    assert services["db"]["image"].startswith("postgis/postgis:")
    assert services["web"]["deploy"]["replicas"] == "${GEOSENSE_PROCESSES:-2}"
    assert services["web"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }
    assert services["nginx"]["depends_on"]["web"] == {"condition": "service_healthy"}


def test_compose_sets_only_variables_the_app_documents_and_production_needs():
    services = compose()["services"]
    for name in ("web", "migrate"):
        env = services[name]["environment"]
        assert set(env) <= documented(), set(env) - documented()
        assert env["DEBUG"] == "0"
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert (
            env["DATABASE_URL"].startswith("postgres://geosense:")
            and "@db:5432/" in env["DATABASE_URL"]
        )
        assert env["REDIS_URL"] == "redis://redis:6379/0"
    assert set(services["db"]["environment"]) <= IMAGE_VARIABLES


def test_compose_mounts_files_that_exist_and_serves_the_collected_static_files():
    services = compose()["services"]
    for volume in services["nginx"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (BASE_DIR / source).is_file(), source
    static = services["web"]["environment"]["STATIC_ROOT"]
    assert f"static:{static}:ro" in services["nginx"]["volumes"]
    locations = (DEPLOY / "nginx" / "geosense-locations.conf").read_text()
    assert f"alias {static}/;" in locations
    assert (BASE_DIR / services["web"]["build"]["dockerfile"]).is_file()


def test_the_processes_listen_where_nginx_sends_them():
    web = compose()["services"]["web"]["command"]
    assert web[web.index("-p") + 1] == "8000" and "--proxy-headers" in web
    assert "server web:8000;" in (DEPLOY / "nginx" / "compose.conf").read_text()

    wanted = unit("geosense.target")["Unit"]["Wants"].split()
    ports = [re.fullmatch(r"geosense-daphne@(\d+)\.service", w).group(1) for w in wanted]
    upstream = re.findall(
        r"server 127\.0\.0\.1:(\d+);", (DEPLOY / "nginx" / "geosense.conf").read_text()
    )
    assert ports == upstream and len(ports) >= 2
    daphne = unit("geosense-daphne@.service")["Service"]
    assert "--proxy-headers -b 127.0.0.1 -p %i " in daphne["ExecStart"]
    assert daphne["Environment"] == "GEOSENSE_ENV_FILE="  # production reads no .env


def test_migrations_run_before_any_process_serves():
    daphne = unit("geosense-daphne@.service")["Unit"]
    assert "geosense-migrate.service" in daphne["Requires"].split()
    assert "geosense-migrate.service" in daphne["After"].split()
    migrate = (DEPLOY / "systemd" / "geosense-migrate.service").read_text()
    assert "manage.py migrate --noinput" in migrate
    assert "manage.py collectstatic --noinput" in migrate


def test_the_production_environment_file_names_only_documented_variables():
    env = env_file(DEPLOY / "geosense.env.example")

    assert set(env) <= documented(), set(env) - documented()
    assert env["DEBUG"] == "0"
    assert env["DATABASE_URL"].startswith("postgres://")
    assert env["REDIS_URL"].startswith("redis://")


def test_check_deploy_is_clean_with_the_production_environment_file(tmp_path):
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    env = {name: value for name, value in os.environ.items() if name in keep}
    env.update(env_file(DEPLOY / "geosense.env.example"))
    env.update(
        SECRET_KEY=secrets.token_urlsafe(50),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",  # the check opens no connection
        GEOSENSE_ENV_FILE="",
    )

    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )

    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert "System check identified no issues" in checked.stdout


def test_nginx_sends_the_apps_content_security_policy_with_static_files():
    static = (
        (DEPLOY / "nginx" / "geosense-locations.conf").read_text().split("location /static/")[1]
    )
    static = static.split("}")[0]

    assert (
        f'add_header Content-Security-Policy "{csp_header(settings.GEOSENSE_CSP)}" always;'
        in static
    )
    assert "add_header X-Content-Type-Options nosniff always;" in static
