"""The connection pool: what an error says of a statement leaves out the values it carried."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from rows import request_record

from gateway.db.connection import connect
from gateway.db.schema import request_records


def test_a_refused_statement_names_no_value_it_carried(database: str) -> None:
    db = connect(database)
    row = request_record(1).row() | {"tenant": "tenant-who-must-not-be-logged"}
    with db.begin() as conn:
        conn.execute(request_records.insert(), [row])
    with pytest.raises(sa.exc.IntegrityError) as refused, db.begin() as conn:
        conn.execute(request_records.insert(), [row])  # the same decision id again
    assert "tenant-who-must-not-be-logged" not in str(refused.value)
    assert "hidden" in str(refused.value)
    db.dispose()
