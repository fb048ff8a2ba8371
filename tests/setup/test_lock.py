"""uv.lock holds the exact versions `make run`, `make test` and CI install, and matches
pyproject.toml (a stale lock fails here and in the Makefile: `make lock` updates it)."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
NETWORK_ENV = {"SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"}
NETWORK_ENV |= {name.lower() for name in NETWORK_ENV}


@pytest.fixture(scope="module")
def uv() -> str:
    path = Path(sys.executable).parent / "uv"  # the Makefile installs it into the venv
    found = str(path) if path.exists() else shutil.which("uv")
    assert found, "uv is not installed in this venv: run `make test` (it installs it)"
    return found


def uv_run(
    uv: str, *args: str, cwd: Path = BASE_DIR, offline: bool = True
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [uv, *args, *(["--offline"] if offline else [])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "UV_PYTHON_DOWNLOADS": "never",
            "HOME": str(Path.home()),
            # Online, the machine's way to the registry: its certificates and proxies.
            **({} if offline else {k: v for k, v in os.environ.items() if k in NETWORK_ENV}),
        },
    )


def test_the_lock_matches_pyproject(uv):
    result = uv_run(uv, "lock", "--check")
    assert result.returncode == 0, result.stderr + "\nrun `make lock` and commit uv.lock"


def test_the_tests_run_on_exactly_the_locked_versions(uv):
    result = uv_run(uv, "sync", "--locked", "--inexact", "--extra", "test", "--check")
    assert result.returncode == 0, result.stderr


def test_a_dependency_added_without_relocking_is_caught(uv, tmp_path):
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(BASE_DIR / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        # sqlparse is locked already (Django needs it): no download, only the mismatch.
        pyproject.read_text().replace(
            "dependencies = [\n", 'dependencies = [\n    "sqlparse",\n', 1
        )
    )

    check = ("lock", "--check", "--python", sys.executable)
    result = uv_run(uv, *check, cwd=tmp_path)
    if "network was disabled" in result.stderr:
        # Resolving the changed project reads the index's metadata for every supported Python,
        # which `make test`'s `uv sync --locked` never fetched on a fresh machine: fetch it.
        result = uv_run(uv, *check, cwd=tmp_path, offline=False)

    assert result.returncode != 0
    assert "needs to be updated" in result.stderr


def test_every_locked_distribution_has_a_hash():
    lock = tomllib.loads((BASE_DIR / "uv.lock").read_text())
    packages = lock["package"]
    project = [p for p in packages if p["source"] == {"virtual": "."}]
    assert [p["name"] for p in project] == ["geosense"]  # the app itself is never built
    assert len(packages) > 50
    for package in packages:
        if package in project:
            continue
        files = package.get("wheels", []) + ([package["sdist"]] if "sdist" in package else [])
        assert files, package["name"]
        assert all(f["hash"].startswith("sha256:") for f in files), package["name"]
