"""Fixtures of the operations tests."""

from uuid import uuid4

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.conftest import database_address


@pytest.fixture
def new_database(transactional_db, django_db_serialized_rollback):
    """`new_database()`: the URL of a new, empty database; every one made is dropped after the test."""
    made: list[str] = []
    admin = database_address("postgres")

    def make() -> str:
        name = f"{settings.DATABASES['default']['NAME']}_{uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        made.append(name)
        return database_address(name)

    yield make
    with psycopg.connect(admin, autocommit=True) as connection:
        for name in made:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
