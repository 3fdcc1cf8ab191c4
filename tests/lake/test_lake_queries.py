"""The Athena queries of docs/lake.md, as written there, on a lake the local stack wrote (issue 47).

    python tests/lake/test_lake_queries.py LAKE_DIR

LAKE_DIR holds NDJSON lake files (`YYYY/MM/DD/HH/*.ndjson`, as `twopc-local demo` writes them under
`$TWOPC_LOCAL_DIR/demo-lake`). DuckDB stands in for Athena: a view `changes` over the files with the Glue
table's columns (key, data and previous as JSON text), and a macro giving Athena's `json_extract_scalar`;
the queries' text is otherwise the docs'. Each answer is checked against the same question answered in
plain Python from the lines themselves, and the transaction lines against the per-item lines.
"""

import decimal
import json
import pathlib
import re
import sys
import unittest

import duckdb

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lake.md"
LAKE = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else ROOT / ".local" / "demo-lake")

# The Glue table's columns (infra/template.yaml, LakeTable), in DuckDB's types: JSON objects as their
# text, as Athena's OpenX SerDe gives a string column holding one.
COLUMNS = {
    "eventId": "VARCHAR",
    "transactionId": "VARCHAR",
    "service": "VARCHAR",
    "table": "VARCHAR",
    "key": "JSON",
    "change": "VARCHAR",
    "version": "BIGINT",
    "committedAt": "VARCHAR",
    "data": "JSON",
    "previous": "JSON",
    "kind": "VARCHAR",
    "firstTransactionId": "VARCHAR",
    "participants": 'STRUCT(service VARCHAR, "table" VARCHAR, changes BIGINT)[]',
    "changes": "BIGINT",
}


def queries() -> dict[str, str]:
    """Each ```sql block of the docs, by its `-- query:` line."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    named = {}
    for block in blocks:
        first, _, rest = block.partition("\n")
        assert first.startswith("-- query: "), first
        named[first.removeprefix("-- query: ")] = rest
    return named


def lines() -> list[dict]:
    found = []
    for path in sorted(LAKE.glob("*/*/*/*/*.ndjson")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def connect(leave_out: str | None = None) -> duckdb.DuckDBPyConnection:
    """DuckDB with the view `changes` over the lake (without the line whose eventId is `leave_out`)."""
    db = duckdb.connect()
    columns = ", ".join(f"'{name}': '{kind}'" for name, kind in COLUMNS.items())
    files = str(LAKE / "*" / "*" / "*" / "*" / "*.ndjson")
    db.execute(
        f"CREATE VIEW changes AS SELECT * FROM read_json('{files}', format = 'newline_delimited', columns = {{{columns}}})"
        + ("" if leave_out is None else f" WHERE eventId IS DISTINCT FROM '{leave_out}'")
    )
    # Athena's name; DuckDB's json_extract_string answers a scalar's text the same way (null when absent).
    db.execute("CREATE MACRO json_extract_scalar(doc, path) AS json_extract_string(doc, path)")
    return db


class LakeQueries(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.queries = queries()
        cls.lines = lines()
        cls.items = [line for line in cls.lines if "kind" not in line]
        cls.transactions = [line for line in cls.lines if line.get("kind") == "transaction"]
        cls.db = connect()

    def run_query(self, name: str, *parameters):
        return self.db.execute(self.queries[name], list(parameters)).fetchall()

    def test_the_docs_have_the_three_queries(self):
        self.assertEqual(
            sorted(self.queries),
            sorted(["every change of transaction X", "transactions whose changes are not all in yet", "balances of account A over time"]),
        )

    def test_the_lake_has_both_kinds_of_line(self):
        self.assertTrue(self.items, f"no per-item line under {LAKE}")
        self.assertTrue(self.transactions, f"no transaction line under {LAKE}")
        self.assertTrue(any(p["changes"] == 0 for t in self.transactions for p in t["participants"]), "a participant with no change (a resource)")

    def test_transaction_lines_agree_with_the_per_item_lines(self):
        for line in self.transactions:
            events = {(i["service"], i["eventId"]) for i in self.items if i["transactionId"] == line["transactionId"]}
            for participant in line["participants"]:
                mine = {e for s, e in events if s == participant["service"]}
                self.assertEqual(participant["changes"], len(mine), line)
            self.assertEqual(line["changes"], len(events), line)

    def test_every_change_of_transaction_x(self):
        for line in self.transactions:
            answer = self.run_query("every change of transaction X", line["transactionId"])
            mine = {i["eventId"]: i for i in self.items if i["transactionId"] == line["transactionId"]}
            self.assertEqual(sorted(row[0] for row in answer), sorted(mine), line["transactionId"])
            for event_id, service, table, entity, change, version, _at, data, previous in answer:
                item = mine[event_id]
                self.assertEqual((service, table, entity, change, version), (item["service"], item["table"], item["key"]["entityId"], item["change"], item["version"]))
                # A JSON null (a REMOVE's data, an INSERT's previous) is a null column, in Athena as here.
                read = [None if text is None else json.loads(text) for text in (data, previous)]
                self.assertEqual(read, [item["data"], item["previous"]])
        self.assertEqual(self.run_query("every change of transaction X", "tx-nobody-made"), [])

    def test_transactions_whose_changes_are_not_all_in_yet(self):
        # The local stack delivered every stream to the end before it stopped: all is in.
        self.assertEqual(self.run_query("transactions whose changes are not all in yet"), [])
        # Without one per-item line (a transaction of two or more changes), that transaction is listed.
        whole = next(t for t in self.transactions if t["changes"] >= 2)
        left_out = next(i["eventId"] for i in self.items if i["transactionId"] == whole["transactionId"])
        partial = connect(left_out)
        answer = partial.execute(self.queries["transactions whose changes are not all in yet"]).fetchall()
        self.assertEqual(answer, [(whole["transactionId"], whole["changes"], whole["changes"] - 1)])

    def test_balances_of_account_a_over_time(self):
        accounts = {(i["table"], i["key"]["entityId"]) for i in self.items if "balance" in (i["data"] or i["previous"] or {})}
        self.assertTrue(accounts, "an account in the lake")
        for table, entity in sorted(accounts):
            answer = self.run_query("balances of account A over time", table, entity)
            versions = {}
            for i in self.items:
                if (i["table"], i["key"]["entityId"]) == (table, entity):
                    balance = (i["data"] or {}).get("balance")
                    versions[i["version"]] = (i["transactionId"], i["change"], None if balance is None else decimal.Decimal(str(balance)))
            self.assertEqual([(v, t, c, b) for v, _at, t, c, b in answer], [(v, *versions[v]) for v in sorted(versions)], (table, entity))


if __name__ == "__main__":
    unittest.main()
