//! `openapi.yaml` checked against the code, so that the two cannot drift: its lists (error codes and
//! the status each is answered with, operation kinds and their fields, statuses, votes, refusal codes,
//! limits) are compared with the core's own constants; its examples are run through the request
//! parser and its schemas; and real answers of the coordinator, for every kind of outcome, are
//! validated against the schema the spec gives for their status.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use twopc::model::{
    DEFAULT_MAX_HOLD_MS, DEFAULT_SERVICE_MAX_HOLD_MS, ErrorCode, MAX_KEY_BYTES, MAX_KEY_NAME_BYTES,
    MAX_OPERATIONS_PER_PARTICIPANT, MAX_TIMEOUT_MS, MIN_HOLD_MS, MIN_TIMEOUT_MS, Operation, ParticipantPart,
    RefusalCode, Status, TransactionRequest, Vote,
};
use twopc_tests::TestEnv;

fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi.yaml"))
        .expect("openapi.yaml is at the top of the repository");
    yaml_serde::from_str(&text).expect("openapi.yaml is YAML")
}

/// The example services' own operations: the inventory's `reserve` and `release`, the payments' `charge`.
fn example_catalogs() -> twopc::custom::Catalogs {
    local_stack::service_operations(SERVICES)
}

/// The spec as the local stack serves it with the example services: their operations in it.
fn served_spec() -> Value {
    yaml_serde::from_str(&local_stack::served_openapi(&example_catalogs())).expect("the served spec is YAML")
}

const SERVICES: [&str; 4] = ["service-a", "service-b", "inventory", "payments"];

/// The coordinator's parser with the example deployment's registry and the services' operations.
fn parse(body: &Value) -> Result<TransactionRequest, twopc::model::Invalid> {
    twopc::coordinator::parse_request_with(body.to_string().as_bytes(), |s| SERVICES.contains(&s), &example_catalogs())
}

/// The built-in operation kinds the spec lists: `op` → its schema.
fn built_in_kinds(spec: &Value) -> std::collections::BTreeMap<String, Value> {
    schema(spec, "Operation")["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| spec.pointer(&kind["$ref"].as_str().unwrap()[1..]).unwrap().clone())
        .filter_map(|kind| kind["properties"]["op"]["const"].as_str().map(|op| (op.to_owned(), kind.clone())))
        .collect()
}

fn schema<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec.pointer(&format!("/components/schemas/{name}")).unwrap_or_else(|| panic!("the spec has schema {name}"))
}

/// A validator for a schema of the spec (its `$ref`s into `components` resolve against the spec).
fn validator(spec: &Value, schema: &Value) -> jsonschema::Validator {
    let mut root = schema.clone();
    root["components"] = spec["components"].clone();
    jsonschema::draft202012::new(&root).unwrap_or_else(|e| panic!("the spec's schema compiles: {e}"))
}

fn strings(value: &Value) -> BTreeSet<String> {
    value.as_array().expect("a list").iter().map(|v| v.as_str().expect("a string").to_owned()).collect()
}

fn names<T: serde::Serialize>(values: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    values.into_iter().map(|v| serde_json::to_value(v).unwrap().as_str().unwrap().to_owned()).collect()
}

/// Every operation's responses: (path, method, status, response with `$ref`s followed).
fn responses(spec: &Value) -> Vec<(String, String, u16, Value)> {
    let mut all = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(answers) = operation.get("responses").and_then(Value::as_object) else { continue };
            for (status, response) in answers {
                let response = match response.get("$ref").and_then(Value::as_str) {
                    Some(reference) => spec.pointer(&reference[1..]).expect("the reference resolves").clone(),
                    None => response.clone(),
                };
                all.push((path.clone(), method.clone(), status.parse().expect("a numeric status"), response));
            }
        }
    }
    all
}

fn response_schema(spec: &Value, path: &str, method: &str, status: u16) -> Value {
    responses(spec)
        .into_iter()
        .find(|(p, m, s, _)| (p.as_str(), m.as_str(), *s) == (path, method, status))
        .map(|(_, _, _, response)| response["content"]["application/json"]["schema"].clone())
        .unwrap_or_else(|| panic!("the spec documents {status} for {method} {path}"))
}

fn error_body(code: ErrorCode) -> Value {
    json!({"transactionId": "tx-00000000000000000000000000000000", "error": {"code": code.as_str(), "message": "m"}})
}

#[test]
fn every_error_code_is_documented_with_the_status_it_is_answered_with() {
    let spec = spec();
    assert_eq!(strings(&schema(&spec, "ErrorCode")["enum"]), names(ErrorCode::ALL.iter().map(|c| c.as_str())));
    let answers = responses(&spec);
    for code in ErrorCode::ALL {
        // Where a code may appear: the documented answers of its status, or (405, which OpenAPI cannot list
        // for a method a path does not have) the schema named for it.
        let accepting: Vec<String> = answers
            .iter()
            .filter(|(_, _, _, response)| {
                let schema = &response["content"]["application/json"]["schema"];
                !schema.is_null() && validator(&spec, schema).is_valid(&error_body(code))
            })
            .map(|(path, method, status, _)| format!("{status} {method} {path}"))
            .collect();
        let wrong_status: Vec<&String> =
            accepting.iter().filter(|a| !a.starts_with(&code.http_status().to_string())).collect();
        assert!(
            wrong_status.is_empty(),
            "{code} is answered with {}, but the spec allows it in {wrong_status:?}",
            code.http_status()
        );
        if code == ErrorCode::MethodNotAllowed {
            assert!(validator(&spec, schema(&spec, "MethodNotAllowedError")).is_valid(&error_body(code)));
        } else {
            assert!(!accepting.is_empty(), "no documented {} answer allows {code}", code.http_status());
        }
    }
}

#[test]
fn operations_and_their_fields_are_the_parsers() {
    let spec = spec();
    let kinds = built_in_kinds(&spec);
    assert_eq!(
        kinds.keys().cloned().collect::<BTreeSet<_>>(),
        Operation::FIELDS.iter().map(|(op, _)| op.to_string()).collect()
    );
    // Every other `op` is a service's own kind, never a built-in one.
    let custom = schema(&spec, "CustomOperation");
    assert_eq!(strings(&custom["properties"]["op"]["not"]["enum"]), kinds.keys().cloned().collect());
    for (op, fields) in Operation::FIELDS {
        let documented = &kinds[&op.to_string()];
        assert_eq!(
            documented["properties"].as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>(),
            fields.iter().map(|f| f.to_string()).collect(),
            "the fields of {op}"
        );
        assert_eq!(documented["properties"]["op"]["const"], op);
        assert_eq!(documented["additionalProperties"], false, "{op} refuses other fields, as the parser does");
    }
    let request = schema(&spec, "TransactionRequest");
    let keys = |v: &Value| v["properties"].as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(keys(request), TransactionRequest::FIELDS.iter().map(|f| f.to_string()).collect());
    assert_eq!(keys(schema(&spec, "ParticipantPart")), ParticipantPart::FIELDS.iter().map(|f| f.to_string()).collect());
    assert_eq!(request["properties"]["timeoutMs"]["minimum"], MIN_TIMEOUT_MS);
    assert_eq!(request["properties"]["timeoutMs"]["maximum"], MAX_TIMEOUT_MS);
    assert_eq!(request["properties"]["timeoutMs"]["default"], twopc::model::DEFAULT_TIMEOUT_MS);
    assert_eq!(
        schema(&spec, "ParticipantPart")["properties"]["operations"]["maxItems"],
        MAX_OPERATIONS_PER_PARTICIPANT
    );
    assert_eq!(request["properties"]["participants"]["maxItems"], twopc::model::MAX_PARTICIPANTS);
    let hold = &request["properties"]["holdMs"];
    assert_eq!((&hold["minimum"], &hold["maximum"]), (&json!(MIN_HOLD_MS), &json!(DEFAULT_MAX_HOLD_MS)));
    let described = hold["description"].as_str().unwrap();
    for bound in [DEFAULT_MAX_HOLD_MS, DEFAULT_SERVICE_MAX_HOLD_MS] {
        assert!(described.contains(&bound.to_string()), "holdMs names the default maximum {bound}: {described}");
    }
    let described = request["properties"]["participants"]["description"].as_str().unwrap().replace(',', "");
    assert!(described.contains(&twopc::record::MAX_RECORD_BYTES.to_string()), "the record's bound, in bytes");
    assert_eq!(schema(&spec, "Key")["additionalProperties"]["anyOf"][0]["maxLength"], MAX_KEY_BYTES);
    assert_eq!(schema(&spec, "Key")["propertyNames"]["maxLength"], MAX_KEY_NAME_BYTES);
}

#[test]
fn statuses_votes_and_refusal_codes_are_the_cores() {
    let spec = spec();
    // ABORTING is never answered: a decided abort is answered as the ABORTED it will be.
    let answered = Status::ALL.iter().filter(|s| **s != Status::Aborting).map(|s| s.as_str());
    assert_eq!(strings(&schema(&spec, "Status")["enum"]), names(answered));
    assert_eq!(strings(&schema(&spec, "Vote")["enum"]), names(Vote::ALL));
    assert_eq!(strings(&schema(&spec, "RefusalCode")["enum"]), names(RefusalCode::ALL));
}

/// The typed client's codes are the spec's: a code the server answers is never `Other` to it.
#[test]
fn the_clients_codes_are_the_specs() {
    let spec = spec();
    let texts = |all: Vec<String>| all.into_iter().collect::<BTreeSet<_>>();
    assert_eq!(
        strings(&schema(&spec, "ErrorCode")["enum"]),
        texts(twopc_client::ErrorCode::ALL.iter().map(|c| c.as_str().to_owned()).collect())
    );
    assert_eq!(
        strings(&schema(&spec, "RefusalCode")["enum"]),
        texts(twopc_client::RefusalCode::ALL.iter().map(|c| c.as_str().to_owned()).collect())
    );
    assert_eq!(
        strings(&schema(&spec, "Vote")["enum"]),
        texts(twopc_client::Vote::ALL.iter().map(|c| c.as_str().to_owned()).collect())
    );
    let statuses = texts(twopc_client::Status::ALL.iter().map(|c| c.as_str().to_owned()).collect());
    assert!(strings(&schema(&spec, "Status")["enum"]).is_subset(&statuses), "{statuses:?}");
}

#[test]
fn every_example_is_valid_and_request_examples_are_accepted_by_the_parser() {
    let spec = spec();
    let served = served_spec();
    let request_schema = validator(&spec, schema(&spec, "TransactionRequest"));
    let served_request_schema = validator(&served, schema(&served, "TransactionRequest"));
    let examples = spec.pointer("/paths/~1transactions/post/requestBody/content/application~1json/examples").unwrap();
    let mut inventory_examples = 0;
    for (name, example) in examples.as_object().unwrap() {
        let request =
            parse(&example["value"]).unwrap_or_else(|e| panic!("request example {name} is refused by the parser: {e}"));
        assert!(request_schema.is_valid(&example["value"]), "request example {name} fails its schema");
        assert!(served_request_schema.is_valid(&example["value"]), "request example {name} fails the served schema");
        if request.participants.iter().any(|p| p.service == inventory::SERVICE) {
            inventory_examples += 1;
        }
    }
    assert!(inventory_examples > 0, "an example shows the inventory's own operations");
    let mut checked = 0;
    for (path, method, status, response) in responses(&spec) {
        let content = &response["content"]["application/json"];
        for (name, example) in content.get("examples").and_then(Value::as_object).into_iter().flatten() {
            let example = match example.get("$ref").and_then(Value::as_str) {
                Some(reference) => spec.pointer(&reference[1..]).unwrap(),
                None => example,
            };
            let errors: Vec<String> =
                validator(&spec, &content["schema"]).iter_errors(&example["value"]).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "example {name} of {status} {method} {path}: {errors:?}");
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} answer examples were found");
}

/// Requests the parser refuses, each with the code it answers. The schema must refuse them too, except
/// those only the server can judge (its registry, DynamoDB's limits, items named twice).
#[test]
fn the_schema_refuses_what_the_parser_refuses() {
    // The spec as served with the configured services' operations: the generic one cannot know a
    // service's kinds or their fields.
    let spec = served_spec();
    let request_schema = validator(&spec, schema(&spec, "TransactionRequest"));
    let reserve = |fields: Value| {
        let mut op = json!({"op": "reserve", "key": {"entityId": "lamp"}});
        op.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        json!({"participants": [{"service": "inventory", "operations": [op]}]})
    };
    let add = |extra: Value| {
        let mut op = json!({"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1});
        op.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"participants": [{"service": "service-a", "operations": [op]}]})
    };
    let cases: Vec<(Value, ErrorCode, bool)> = vec![
        (json!([]), ErrorCode::InvalidRequest, true),
        (json!({}), ErrorCode::NoParticipants, true),
        (json!({"participants": []}), ErrorCode::NoParticipants, true),
        (json!({"participants": [], "other": 1}), ErrorCode::InvalidRequest, true),
        (json!({"participants": [{"service": "service-a", "operations": []}]}), ErrorCode::NoOperations, true),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "merge", "key": {"entityId": "A"}}]}]}),
            ErrorCode::UnknownOperation,
            true,
        ),
        (add(json!({"delta": "ten"})), ErrorCode::InvalidRequest, true),
        (add(json!({"key": {}})), ErrorCode::InvalidRequest, true),
        (add(json!({"key": {"entityId": ""}})), ErrorCode::InvalidRequest, true),
        (add(json!({"key": {"": "A"}})), ErrorCode::InvalidRequest, true),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "put", "key": {"entityId": "A"}, "data": {"x": {"y": [{"": 1}]}}}]}]}),
            ErrorCode::InvalidRequest,
            true,
        ),
        (add(json!({"field": ""})), ErrorCode::InvalidRequest, true),
        (add(json!({"ifNotExists": true})), ErrorCode::InvalidRequest, true),
        (add(json!({"key": {"entityId": "x".repeat(MAX_KEY_BYTES + 1)}})), ErrorCode::LimitExceeded, true),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "b", "delta": 1}]}], "timeoutMs": 99}),
            ErrorCode::InvalidRequest,
            true,
        ),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "check", "key": {"entityId": "A"}, "version": -1}]}]}),
            ErrorCode::InvalidRequest,
            true,
        ),
        (
            json!({"participants": [{"service": "service-z", "operations": [{"op": "delete", "key": {"entityId": "A"}}]}]}),
            ErrorCode::UnknownService,
            false,
        ),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "A"}}]}, {"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "B"}}]}]}),
            ErrorCode::DuplicateService,
            false,
        ),
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "A"}}, {"op": "delete", "key": {"entityId": "A"}}]}]}),
            ErrorCode::DuplicateItem,
            false,
        ),
        (add(json!({"delta": 1e200})), ErrorCode::InvalidRequest, false),
        // A service's own operations: its schema's fields and types, and its kinds.
        (reserve(json!({})), ErrorCode::InvalidRequest, true),
        (reserve(json!({"quantity": "3"})), ErrorCode::InvalidRequest, true),
        (reserve(json!({"quantity": 0})), ErrorCode::InvalidRequest, true),
        (reserve(json!({"quantity": 1.5})), ErrorCode::InvalidRequest, true),
        (reserve(json!({"quantity": 1, "colour": "red"})), ErrorCode::InvalidRequest, true),
        (reserve(json!({"quantity": 1, "key": {}})), ErrorCode::InvalidRequest, true),
        (
            json!({"participants": [{"service": "inventory", "operations": [{"op": "restock", "key": {"entityId": "lamp"}, "quantity": 1}]}]}),
            ErrorCode::UnknownOperation,
            true,
        ),
        // Which service speaks which kind is the registry's, as the service names are.
        (
            json!({"participants": [{"service": "service-a", "operations": [{"op": "reserve", "key": {"entityId": "lamp"}, "quantity": 1}]}]}),
            ErrorCode::UnknownOperation,
            false,
        ),
    ];
    for (body, code, schema_refuses) in cases {
        let refused = parse(&body).expect_err(&format!("the parser refuses {body}"));
        assert_eq!(refused.code, code, "{body}: {refused}");
        if schema_refuses {
            assert!(!request_schema.is_valid(&body), "the schema accepts {body}, which the parser refuses: {refused}");
        }
    }
}

/// The served spec describes each service's own operations as the service declares them, and the
/// client's builders (the generic one and the inventory's typed one) write what both the schema and the
/// parser accept.
#[test]
fn the_served_spec_and_the_client_express_the_services_operations() {
    let spec = served_spec();
    let declared = example_catalogs();
    let catalog = declared.of(inventory::SERVICE);
    let custom: BTreeSet<String> = schema(&spec, "CustomOperation")["anyOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| kind["$ref"].as_str().unwrap().rsplit('/').next().unwrap().to_owned())
        .collect();
    let mut expected: BTreeSet<String> = catalog.schemas().map(|s| format!("inventory.{}", s.op)).collect();
    expected.insert("payments.charge".to_owned());
    assert_eq!(custom, expected);
    for operation in catalog.schemas() {
        let documented = schema(&spec, &format!("inventory.{}", operation.op));
        assert_eq!(documented["x-service"], "inventory");
        assert_eq!(documented["properties"]["op"]["const"], operation.op.as_str());
        let fields: BTreeSet<String> = documented["properties"].as_object().unwrap().keys().cloned().collect();
        let mut expected: BTreeSet<String> = operation.fields.keys().cloned().collect();
        expected.extend(["op".to_owned(), "key".to_owned()]);
        assert_eq!(fields, expected, "the fields of inventory's {}", operation.op);
    }
    // Without services of their own, no custom operation at all.
    let plain: Value = yaml_serde::from_str(&local_stack::served_openapi(&Default::default())).unwrap();
    assert!(plain.pointer("/components/schemas/CustomOperation").is_none());
    assert_eq!(built_in_kinds(&plain).len(), schema(&plain, "Operation")["oneOf"].as_array().unwrap().len());

    use twopc_client::{Transaction, op};
    let request_schema = validator(&spec, schema(&spec, "TransactionRequest"));
    let order = Transaction::new()
        .participant(op::inventory::SERVICE, [op::inventory::reserve("lamp", 2), op::inventory::release("chair", 1)])
        .participant("service-a", [op::add("alice", "balance", -30).min(0)]);
    let generic = Transaction::new().participant("inventory", [op::custom("reserve", "lamp").field("quantity", 2)]);
    let held = order.clone().hold(std::time::Duration::from_secs(600));
    assert_eq!(held.to_json()["holdMs"], 600_000);
    for request in [order, generic, held] {
        let body = request.to_json();
        parse(&body).unwrap_or_else(|e| panic!("the parser refuses {body}: {e}"));
        let errors: Vec<String> = request_schema.iter_errors(&body).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "the served schema refuses {body}: {errors:?}");
    }
}

/// `POST /transactions/{id}/commit` or `/abort` through the coordinator function's handler.
async fn decide(env: &TestEnv, id: &str, decision: &str) -> (u16, Value) {
    env.call(&twopc_tests::decision_event(id, decision)).await
}

/// Real answers of the coordinator, one of every kind a client can meet without injected faults, each
/// validated against the schema the spec documents for its operation and status.
#[tokio::test]
async fn real_answers_match_the_documented_schemas() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let spec = spec();
    let check = |path: &str, method: &str, status: u16, body: &Value| {
        let schema = response_schema(&spec, path, method, status);
        let errors: Vec<String> = validator(&spec, &schema).iter_errors(body).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{status} {method} {path} answered {body}, which its schema refuses: {errors:?}");
    };
    let transfer = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "30");
    let (status, committed) = env.post(&transfer, Some("openapi-commit")).await;
    assert_eq!(status, 200, "{committed}");
    check("/transactions", "post", status, &committed);
    let (status, refused) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "500"), None).await;
    assert_eq!(status, 409, "{refused}");
    check("/transactions", "post", status, &refused);
    let (status, reused) =
        env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "31"), Some("openapi-commit")).await;
    assert_eq!(status, 422, "{reused}");
    check("/transactions", "post", status, &reused);
    for body in ["{", "{}", r#"{"participants": [{"service": "service-z", "operations": []}]}"#] {
        let (status, invalid) = env.post_raw(body, None).await;
        assert_eq!(status, 400, "{invalid}");
        check("/transactions", "post", status, &invalid);
    }
    let (status, invalid_key) = env.post(&transfer, Some("")).await;
    assert_eq!((status, &invalid_key["error"]["code"]), (400, &json!("INVALID_IDEMPOTENCY_KEY")));
    check("/transactions", "post", status, &invalid_key);
    let id = committed["transactionId"].as_str().unwrap();
    // An id longer than DynamoDB's key limit names no transaction: a 404, not the store's refusal as a 503.
    let too_long = "x".repeat(MAX_KEY_BYTES + 1);
    // A read answers 200 whatever the outcome (an aborted one's included), 404 for an unknown id.
    let ids = [(id, 200), (refused["transactionId"].as_str().unwrap(), 200), ("tx-unknown", 404), (&too_long, 404)];
    for (id, expected) in ids {
        let (status, body) = env.get(id).await;
        assert_eq!(status, expected, "{body}");
        check("/transactions/{id}", "get", status, &body);
    }

    // Decide later: a held transaction's 202, its GET, and every answer of its commit and abort.
    let held = |amount: &str| {
        let mut body = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), amount);
        body["holdMs"] = json!(60_000);
        body
    };
    let (status, approved) = env.post(&held("10"), None).await;
    assert_eq!((status, approved["status"].as_str()), (202, Some("PREPARED")), "{approved}");
    check("/transactions", "post", status, &approved);
    let approved_id = approved["transactionId"].as_str().unwrap();
    let (status, body) = env.get(approved_id).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("PREPARED")), "{body}");
    check("/transactions/{id}", "get", status, &body);
    for _ in 0..2 {
        let (status, body) = decide(&env, approved_id, "commit").await;
        assert_eq!((status, body["status"].as_str()), (200, Some("COMMITTED")), "{body}");
        check("/transactions/{id}/commit", "post", status, &body);
    }
    let (status, body) = decide(&env, approved_id, "abort").await;
    assert_eq!((status, body["status"].as_str()), (409, Some("COMMITTED")), "{body}");
    check("/transactions/{id}/abort", "post", status, &body);

    let (status, rejected) = env.post(&held("5"), None).await;
    assert_eq!(status, 202, "{rejected}");
    let rejected_id = rejected["transactionId"].as_str().unwrap();
    for _ in 0..2 {
        let (status, body) = decide(&env, rejected_id, "abort").await;
        assert_eq!((status, body["status"].as_str()), (200, Some("ABORTED")), "{body}");
        check("/transactions/{id}/abort", "post", status, &body);
    }
    let (status, body) = decide(&env, rejected_id, "commit").await;
    assert_eq!((status, body["status"].as_str()), (409, Some("ABORTED")), "{body}");
    check("/transactions/{id}/commit", "post", status, &body);

    let not_held = committed["transactionId"].as_str().unwrap();
    for decision in ["commit", "abort"] {
        let path = format!("/transactions/{{id}}/{decision}");
        let (status, body) = decide(&env, not_held, decision).await;
        assert_eq!((status, &body["error"]["code"]), (409, &json!("NOT_HELD")), "{body}");
        check(&path, "post", status, &body);
        let (status, body) = decide(&env, "tx-unknown", decision).await;
        assert_eq!(status, 404, "{body}");
        check(&path, "post", status, &body);
    }
    // Longer than a service accepts (15 minutes by default): refused before anything is locked.
    let mut too_long = held("1");
    too_long["holdMs"] = json!(DEFAULT_SERVICE_MAX_HOLD_MS + 1);
    let (status, body) = env.post(&too_long, None).await;
    assert_eq!((status, &body["error"]["code"]), (400, &json!("LIMIT_EXCEEDED")), "{body}");
    check("/transactions", "post", status, &body);
}
