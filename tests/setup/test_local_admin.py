"""The local superuser `make run` keeps for /admin/, from the login in `.env`."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db

PASSWORD = "a-generated-password-123"


def local_admin(**options) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("local_admin", stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def admin_env(settings):
    settings.DEBUG = True
    settings.GEOSENSE_ADMIN_USERNAME = "admin"
    settings.GEOSENSE_ADMIN_PASSWORD = PASSWORD
    return settings


def test_it_creates_the_superuser_and_prints_its_login(admin_env, client):
    out, _ = local_admin(url="http://127.0.0.1:8000/")

    assert out == f"The admin is at http://127.0.0.1:8000/admin/: log in as admin / {PASSWORD}\n"
    user = get_user_model().objects.get(username="admin")
    assert user.is_superuser and user.is_staff and user.is_active
    assert client.login(username="admin", password=PASSWORD)
    assert client.get("/admin/").status_code == 200


def test_a_second_run_restores_the_login_printed(admin_env):
    local_admin()
    user = get_user_model().objects.get(username="admin")
    user.set_password("changed")
    user.is_staff = user.is_superuser = False
    user.save()

    local_admin()

    user.refresh_from_db()
    assert user.check_password(PASSWORD)
    assert user.is_staff and user.is_superuser
    assert get_user_model().objects.filter(username="admin").count() == 1


def test_with_debug_off_there_is_no_local_superuser(admin_env):
    admin_env.DEBUG = False

    out, err = local_admin()

    assert out == ""
    assert "DEBUG is off" in err
    assert not get_user_model().objects.filter(username="admin").exists()


def test_without_a_password_it_says_so_and_creates_nobody(admin_env):
    admin_env.GEOSENSE_ADMIN_PASSWORD = ""

    out, err = local_admin()

    assert out == ""
    assert "GEOSENSE_ADMIN_PASSWORD" in err
    assert not get_user_model().objects.filter(username="admin").exists()
