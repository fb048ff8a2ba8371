"""The credit ledger: a stored call is charged once, whatever id the model gave it."""

import pytest
from django.contrib.auth import get_user_model

from geosense.accounts.models import CreditCharge
from geosense.accounts.services import (
    InsufficientCredits,
    credit_balance,
    credit_charge,
    credit_set,
)

pytestmark = pytest.mark.django_db


def _user(name: str, balance: int):
    user = get_user_model().objects.create_user(name, password="pw")
    credit_set(user=user, balance=balance)
    return user


def _charge(user, session_id: str, call_id: str = "call_0") -> int:
    return credit_charge(
        user=user, amount=5, session_id=session_id, tool_call_id=call_id, tool_name="search"
    )


def test_one_stored_call_is_charged_once():
    alice = _user("alice", 20)
    assert _charge(alice, "s1") == 15
    assert _charge(alice, "s1") == 15
    assert CreditCharge.objects.count() == 1


def test_the_same_call_id_in_another_session_is_another_charge():
    alice, bob = _user("alice", 20), _user("bob", 20)
    _charge(alice, "s1")
    _charge(alice, "s2")
    _charge(bob, "s3")
    assert (credit_balance(user=alice), credit_balance(user=bob)) == (10, 15)
    assert CreditCharge.objects.count() == 3


def test_a_charge_the_balance_cannot_cover_changes_nothing():
    alice = _user("alice", 4)
    with pytest.raises(InsufficientCredits):
        _charge(alice, "s1")
    assert credit_balance(user=alice) == 4
    assert not CreditCharge.objects.exists()
