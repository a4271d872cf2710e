"""Shared fixtures for the kvprefix package tests (run by scripts/test.sh against the package
installed into build-py/venv)."""

import pathlib
import random

import pytest

import kvprefix

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def ns():
    return kvprefix.Namespace(model="llama-3.1-8b", tenant="acme")


@pytest.fixture
def cache():
    c = kvprefix.Cache(256, 4)
    yield c
    if not c.closed:
        c.check()
    c.close()


def prompt(n, seed=1):
    """n deterministic pseudo-random tokens."""
    rng = random.Random(seed)
    return [rng.randrange(1 << 17) for _ in range(n)]
