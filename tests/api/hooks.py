"""Schemathesis hooks for the REST API run (tests/api/run.sh).

Two checks of our own, besides schemathesis' built-in ones:
- `rejected_requests_write_nothing`: every table of the stack is read before each call; a request
  answered 400, 404, 405, 413 or 422 must leave every item as it was (invariant 9). A 409 is an aborted
  transaction, which writes its record by design.
- `schema_valid_refusals_are_server_rules`: a request the spec calls valid may still be refused, but only
  for what no JSON schema can say: services not in this deployment's registry, a service's own
  operation sent to another service, a service or an item named twice, DynamoDB's limits, `min` above
  `max`. Anything else is a spec that promises too much.
"""

import os
import re

import boto3
import schemathesis

PREFIX = os.environ["TWOPC_TABLE_PREFIX"]
dynamodb = boto3.client(
    "dynamodb",
    endpoint_url=os.environ["TWOPC_DYNAMODB_ENDPOINT"],
    region_name="us-east-1",
    aws_access_key_id="local",
    aws_secret_access_key="local",
)

# UNKNOWN_OPERATION: a service's own kind sent to another service (which service speaks which kind is
# the registry's, as the service names are). INVALID_AGE_TOKEN and AGE_TOKEN_USED: whether an Age-Token is
# one the coordinator signed for this caller and body, and unused, is the coordinator's to say. So is
# whether a page token of GET /admin/outcomes is one the outcome history answered and has not expired.
SERVER_JUDGED_CODES = {
    "UNKNOWN_SERVICE",
    "DUPLICATE_SERVICE",
    "DUPLICATE_ITEM",
    "LIMIT_EXCEEDED",
    "IDEMPOTENCY_KEY_REUSED",
    "UNKNOWN_OPERATION",
    "INVALID_AGE_TOKEN",
    "AGE_TOKEN_USED",
}
SERVER_JUDGED_MESSAGES = re.compile(
    r"is greater than max|significant digits|outside DynamoDB's range|nests too deep|(min|max) - delta"
    r"|the outcome history refused this page token"
)
WRITES_NOTHING = {400, 404, 405, 413, 415, 422}

_before = {}


def _tables():
    names = dynamodb.list_tables()["TableNames"]
    return sorted(name for name in names if name.startswith(PREFIX))


def _snapshot():
    state = {}
    for table in _tables():
        items, start = [], None
        while True:
            page = dynamodb.scan(TableName=table, ConsistentRead=True, **({"ExclusiveStartKey": start} if start else {}))
            items.extend(page["Items"])
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        state[table] = sorted(repr(sorted(item.items())) for item in items)
    return state


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    # A bodiless POST (commit, abort) says JSON as every client does: the local stack answers a POST
    # of any other type 415 (a test of its own covers that), which would leave those routes unexplored.
    if case.method.upper() == "POST" and not any(k.lower() == "content-type" for k in (case.headers or {})):
        case.headers = {**(case.headers or {}), "Content-Type": "application/json"}
    _before[id(case)] = _snapshot()


@schemathesis.check
def rejected_requests_write_nothing(ctx, response, case):
    before = _before.pop(id(case), None)
    if before is None or response.status_code not in WRITES_NOTHING:
        return None
    after = _snapshot()
    if after != before:
        changed = [t for t in after if after[t] != before.get(t)]
        raise AssertionError(f"a request answered {response.status_code} changed the tables {changed}")
    return True


@schemathesis.check
def schema_valid_refusals_are_server_rules(ctx, response, case):
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 422):
        return None
    error = (response.json() or {}).get("error", {})
    code, message = error.get("code"), error.get("message", "")
    if code in SERVER_JUDGED_CODES or (code == "INVALID_REQUEST" and SERVER_JUDGED_MESSAGES.search(message)):
        return True
    raise AssertionError(f"a request valid by the spec was refused with {code}: {message}")


REGISTERED = ["service-a", "service-b"]


@schemathesis.hook
def map_body(ctx, body):
    """Names the local stack's services in the first two parts of a request, so that generated requests
    reach the participants instead of stopping at the registry (a third part keeps its generated name,
    so unknown services are still tried)."""
    parts = body.get("participants") if isinstance(body, dict) else None
    if isinstance(parts, list):
        for part, service in zip(parts, REGISTERED):
            if isinstance(part, dict) and isinstance(part.get("service"), str):
                part["service"] = service
    return body


@schemathesis.hook
def before_load_schema(ctx, raw_schema):
    """The local stack takes unsigned requests: deployed, API Gateway's IAM authorization refuses an
    unsigned one before the coordinator runs, so the spec's SigV4 requirement is not the coordinator's
    to test here."""
    raw_schema.pop("security", None)
