"""Python 3.11 to 3.13: the metadata says so, nothing in the code needs more than 3.11, and the
Makefile finds a fitting interpreter or says what it needs."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
CODE = ["geosense", "chat", "tools", "tests", "bench", "manage.py"]
FIND_PYTHON = BASE_DIR / "scripts" / "find-python"


def pyproject() -> dict:
    return tomllib.loads((BASE_DIR / "pyproject.toml").read_text())


def test_the_metadata_admits_3_11_to_3_13():
    project = pyproject()
    assert project["project"]["requires-python"] == ">=3.11,<3.14"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    classifiers = project["project"]["classifiers"]
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers


def test_no_standard_library_api_newer_than_3_11_is_used():
    # vermin knows when each module, function and argument appeared. `float.is_integer` is
    # old; vermin takes it for `int.is_integer` (3.12) as it cannot see the type.
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "vermin"),
            *("--no-tips", "--violations", "-t=3.11-", "--exclude", "int.is_integer"),
            *CODE,
        ],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error:" not in result.stdout, result.stdout


def test_no_syntax_newer_than_3_11_is_used():
    # ruff reports syntax a target version cannot parse (PEP 695 aliases, PEP 701 f-strings…).
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--select=E9",
            "--target-version=py311",
            *CODE,
        ],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def fake_interpreter(bin_dir: Path, name: str, *, says: str, status: int = 1) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho '{says}' >&2\nexit {status}\n")
    script.chmod(0o755)


def find_python(bin_dir: Path, *candidates: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FIND_PYTHON), *candidates],
        env={"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_first_fitting_interpreter_is_chosen(tmp_path):
    fake_interpreter(
        tmp_path, "python3.13", says="pyenv: python3.13: command not found", status=127
    )
    (tmp_path / "python3.12").symlink_to(sys.executable)  # this one: 3.11, which fits
    fake_interpreter(tmp_path, "python3", says="never asked")

    result = find_python(tmp_path, "python3.13", "python3.12", "python3")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "python3.12")  # its own sys.executable


def test_when_none_fits_it_says_what_each_is_and_what_it_needs(tmp_path):
    fake_interpreter(
        tmp_path, "python3.12", says="pyenv: python3.12: command not found", status=127
    )
    fake_interpreter(tmp_path, "python3.11", says="Python 3.11.2 without its venv module")
    fake_interpreter(tmp_path, "oldpython", says="Python 3.10.12")

    result = find_python(tmp_path, "python3.13-nowhere", "python3.12", "python3.11", "oldpython")

    assert result.returncode == 1
    assert result.stdout == ""
    assert "GeoSense needs Python 3.11, 3.12 or 3.13 with its venv module" in result.stderr
    assert "python3.13-nowhere: not found" in result.stderr
    assert "python3.12: pyenv: python3.12: command not found" in result.stderr
    assert "python3.11: Python 3.11.2 without its venv module" in result.stderr
    assert "oldpython: Python 3.10.12" in result.stderr
    assert "make run PYTHON=" in result.stderr


def test_the_real_check_refuses_an_interpreter_outside_the_range(tmp_path):
    # The same check, run by this interpreter pretending to be 3.10 and 3.14.
    check = FIND_PYTHON.read_text().split("check='", 1)[1].split("'\n", 1)[0]
    for version in ((3, 10, 12), (3, 14, 0)):
        fake = f"import sys; sys.version_info = {version!r}\n" + check
        result = subprocess.run([sys.executable, "-c", fake], capture_output=True, text=True)
        assert result.returncode == 1
        assert result.stderr.strip() == "Python {}.{}.{}".format(*version)
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.strip() == sys.executable


def test_make_stops_before_creating_a_venv_with_an_unfit_python(tmp_path):
    fake_interpreter(tmp_path, "oldpython", says="Python 3.10.12")
    project = tmp_path / "clone"
    (project / "scripts").mkdir(parents=True)
    for name in ("Makefile", "scripts/find-python"):
        (project / name).write_bytes((BASE_DIR / name).read_bytes())
    (project / "scripts" / "find-python").chmod(0o755)

    result = subprocess.run(
        ["make", "-C", str(project), ".venv/bin/python", "PYTHON=oldpython"],
        env={"PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "oldpython: Python 3.10.12" in result.stderr
    assert not (project / ".venv").exists()


def test_the_makefile_tries_3_13_then_3_12_then_3_11_then_python3():
    makefile = (BASE_DIR / "Makefile").read_text()
    assert "PYTHON_CANDIDATES := python3.13 python3.12 python3.11 python3\n" in makefile
