import pytest
from django.contrib.auth import get_user_model

from geosense.accounts.services import credit_balance, credit_set, demo_user_ensure

pytestmark = pytest.mark.django_db


def test_the_demo_user_gets_100_credits_once_and_keeps_what_it_spent():
    assert demo_user_ensure() is True
    user = get_user_model().objects.get(username="demo")
    assert user.check_password("demo")
    assert credit_balance(user=user) == 100
    credit_set(user=user, balance=42)

    assert demo_user_ensure() is False
    assert credit_balance(user=user) == 42
