//! Who may do what: the caller of either API and the deployment's access policy (`ACCESS_POLICY`).
//!
//! A caller is an IAM principal (a backend service, signed with SigV4: its canonical ARN,
//! [`crate::principal`]) or a JWT principal (a browser or app user, from the authorizer:
//! `jwt:<iss>#<sub>`). Admins may do everything. Any other caller *owns* the items whose `entityId` is
//! its `sub` or starts with `<sub>#`, and may:
//! - follow `entity:<table>:<id>` and guard (`min`, `max`, `check`) an item only when it owns it: a
//!   guard is a read, and a refusal an answer about the item's value;
//! - write only the items it owns, plus credits to others (`add` with a positive `delta` and no guard)
//!   on the fields the policy names (`allowCredits`), and never inside a held request (a held credit
//!   would hold the owner's own debits for the whole hold, and its abort would cost nothing);
//! - see (GET, follow `tx:<id>`, commit or abort a held one) only the transactions it created.
//!
//! IAM principals are admins unless the policy lists which are (`iamAdmins`); one not listed is held to
//! the same rules as a JWT user whose `sub` is its ARN (it owns no item, and sees its own transactions).
//! A request with no identity at all (only where no authorizer runs: the local stack without `--auth`)
//! is taken as an IAM caller without an ARN.
//!
//! The policy is configuration, not code:
//! ```json
//! {"adminGroups": ["admins"], "adminClaim": "twopc:admin", "iamAdmins": ["*"],
//!  "allowCredits": {}, "readTables": null, "writeServices": null,
//!  "operators": [], "operatorGroups": []}
//! ```
//! Operators (`operators`: IAM role names or ARNs; `operatorGroups`: JWT groups) may use the admin API
//! (`/admin`: list, inspect, retry and abort transactions); nobody by default, and an admin is not one.
//! every field optional, with these defaults. `allowCredits` names, per service, the fields a
//! non-admin may credit on items it does not own (`{"service-a": ["balance"]}`; none by default); the
//! boolean it was before still works, with a warning at each parse: `true` is any field of the
//! services in `writeServices`, `false` none. `readTables` (when a list) narrows the tables whose owned
//! items a non-admin may follow; `writeServices` the services whose owned items it may write or guard.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{ErrorCode, Invalid, Operation, TransactionRequest};
use crate::tables::item_attr;

/// The policy's setting: `ACCESS_POLICY`, JSON (unset or empty: the defaults).
pub const ACCESS_POLICY: &str = "ACCESS_POLICY";
/// What a JWT principal's canonical form starts with.
pub const JWT_PREFIX: &str = "jwt:";

/// Which kind of credentials a caller came with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallerKind {
    Iam,
    Jwt,
}

/// The caller of a request, as the deployment's authorization established it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// Canonical: an IAM ARN ([`crate::principal`]) or `jwt:<iss>#<sub>`; None for a request that came
    /// with no identity (no authorizer ran).
    pub principal: Option<String>,
    pub kind: CallerKind,
    /// The id its owned items start with: a JWT's `sub`, an IAM principal's ARN.
    pub sub: Option<String>,
    pub admin: bool,
    /// One of the operators the policy names (`operators`, `operatorGroups`): it may use the admin API
    /// (`/admin`). Being an admin does not make one: `iamAdmins` is every IAM caller by default.
    #[serde(default)]
    pub operator: bool,
}

impl Caller {
    /// A JWT principal, as the authorizer established it (its claims checked, `admin` per the policy).
    pub fn jwt(issuer: &str, sub: &str, admin: bool) -> Caller {
        Caller {
            principal: Some(jwt_principal(issuer, sub)),
            kind: CallerKind::Jwt,
            sub: Some(sub.to_owned()),
            admin,
            operator: false,
        }
    }

    /// This caller, an operator or not as the policy says.
    pub fn operating(self, operator: bool) -> Caller {
        Caller { operator, ..self }
    }

    /// A caller nobody could establish (an authorizer's context that is not ours, a connection without
    /// its `$connect`): no principal, no admin, owns nothing.
    pub fn nobody() -> Caller {
        Caller { principal: None, kind: CallerKind::Jwt, sub: None, admin: false, operator: false }
    }

    pub fn is_iam(&self) -> bool {
        self.kind == CallerKind::Iam
    }

    /// Whether it owns the item with this `entityId`: its `sub`, or `<sub>#...`.
    pub fn owns(&self, entity_id: &str) -> bool {
        match &self.sub {
            Some(sub) if !sub.is_empty() => {
                entity_id == sub || entity_id.strip_prefix(sub.as_str()).is_some_and(|rest| rest.starts_with('#'))
            }
            _ => false,
        }
    }

    /// The caller for the authorizer's context fields (`principal`, `sub`, `admin`, `operator`).
    pub fn from_context(
        principal: &str,
        sub: Option<&str>,
        admin: Option<&str>,
        operator: Option<&str>,
    ) -> Option<Caller> {
        let rest = principal.strip_prefix(JWT_PREFIX)?;
        // A sub never has `#` (the verifier refuses one); an issuer's URL might.
        let (_, sub_in_principal) = rest.rsplit_once('#')?;
        let sub = sub.unwrap_or(sub_in_principal);
        if sub != sub_in_principal || sub.is_empty() {
            return None;
        }
        Some(Caller {
            principal: Some(principal.to_owned()),
            kind: CallerKind::Jwt,
            sub: Some(sub.to_owned()),
            admin: admin == Some("true"),
            operator: operator == Some("true"),
        })
    }
}

/// Whether the token's `cognito:groups` or `groups` claim (a list, or one group) holds one of `groups`.
fn in_groups(claims: &Value, groups: &[String]) -> bool {
    ["cognito:groups", "groups"].iter().any(|name| match &claims[*name] {
        Value::Array(held) => held.iter().any(|g| g.as_str().is_some_and(|g| groups.iter().any(|a| a == g))),
        Value::String(group) => groups.iter().any(|a| a == group),
        _ => false,
    })
}

/// `jwt:<iss>#<sub>`: an OIDC issuer URL has no fragment, so the first `#` ends it.
pub fn jwt_principal(issuer: &str, sub: &str) -> String {
    format!("{JWT_PREFIX}{issuer}#{sub}")
}

/// The access policy of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// A JWT whose `cognito:groups` or `groups` claim holds one of these is an admin.
    pub admin_groups: Vec<String>,
    /// A JWT whose claim of this name is `true` (or `"true"`) is an admin.
    pub admin_claim: String,
    /// IAM principals that are admins: `*` for all, else role names or canonical ARNs.
    pub iam_admins: Vec<String>,
    /// The fields non-admins may credit on items they do not own (`add`, positive `delta`, no guard).
    pub allow_credits: Credits,
    /// Tables whose owned items non-admins may follow (None: every table).
    pub read_tables: Option<Vec<String>>,
    /// Services whose owned items non-admins may write or guard (None: every service).
    pub write_services: Option<Vec<String>>,
    /// Services whose own participant authorizes the callers of their custom operations (it gets the
    /// caller's principal). Any other service's custom operation is a write like the others: on the
    /// caller's own items only.
    pub self_authorizing_services: Vec<String>,
    /// IAM principals that may use the admin API (`/admin`): role names or canonical ARNs; `*` is not
    /// taken (an operator is named). None by default.
    pub operators: Vec<String>,
    /// A JWT whose `cognito:groups` or `groups` claim holds one of these is an operator. None by default.
    pub operator_groups: Vec<String>,
    /// A request with no identity at all is an operator's. Only the local stack without `--auth` sets
    /// it (every caller may do everything there); a deployment's API lets no such request through.
    pub unauthenticated_operator: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            admin_groups: vec!["admins".to_owned()],
            admin_claim: "twopc:admin".to_owned(),
            iam_admins: vec!["*".to_owned()],
            allow_credits: Credits::default(),
            read_tables: None,
            write_services: None,
            self_authorizing_services: Vec::new(),
            operators: Vec::new(),
            operator_groups: Vec::new(),
            unauthenticated_operator: false,
        }
    }
}

/// The fields non-admins may credit on items they do not own: `allowCredits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a map of service names to the fields that may be credited, such as {\"service-a\": [\"balance\"]} \
                 (or, deprecated, true or false)"
)]
pub enum Credits {
    /// Per service, the numeric fields that may be credited.
    Fields(BTreeMap<String, Vec<String>>),
    /// The policy's boolean before fields were named (deprecated): `true` is any field of the services
    /// in `writeServices` (every service when that is null), `false` none.
    Any(bool),
}

impl Default for Credits {
    /// None: the deployment names what may be credited (the templates' default names the example wallets).
    fn default() -> Self {
        Credits::Fields(BTreeMap::new())
    }
}

impl Credits {
    /// Whether any credit at all is allowed.
    fn any(&self) -> bool {
        match self {
            Credits::Fields(fields) => fields.values().any(|f| !f.is_empty()),
            Credits::Any(allowed) => *allowed,
        }
    }
}

/// How a non-admin's operation is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// An admin's, or a self-authorizing service's own operation: the service judges.
    Unchecked,
    /// On an item the caller owns.
    Owned,
    /// A credit to an item the caller does not own, on a field the policy names.
    Credit,
}

/// What a caller may not do, as the answer says it: `code` decides the status (403 `FORBIDDEN` and
/// `HELD_CREDIT_NOT_ALLOWED`, 400 `GUARD_NOT_ALLOWED`).
pub type Refusal = Invalid;

impl Policy {
    /// The policy a setting names: unset or blank is the default one.
    pub fn parse(text: Option<&str>) -> Result<Policy, String> {
        let policy: Policy = match text.map(str::trim) {
            None | Some("") => Policy::default(),
            Some(text) => serde_json::from_str(text).map_err(|e| format!("expected the access policy's JSON: {e}"))?,
        };
        if policy.operators.iter().any(|entry| entry.contains('*')) {
            return Err("operators names IAM role names or ARNs one by one: \"*\" is not taken (every IAM caller \
                        would be an operator)"
                .to_owned());
        }
        if let Credits::Any(allowed) = policy.allow_credits {
            let meaning = match allowed {
                true => {
                    "true lets non-admins credit any field of every service in writeServices (all services \
                         when it is null), stock and counters included."
                }
                false => "false allows no credits, as {} does.",
            };
            // Said at every start: a deployment keeps working, and learns what to write instead.
            tracing::warn!(
                allow_credits = allowed,
                "the access policy's allowCredits is a boolean, which is deprecated: {meaning} Name the fields \
                 instead, such as \"allowCredits\": {{\"service-a\": [\"balance\"]}} (infra/DEPLOY.md)"
            );
        }
        Ok(policy)
    }

    /// `ACCESS_POLICY` from the environment.
    pub fn from_env() -> Result<Policy, crate::config::ConfigError> {
        Policy::parse(std::env::var(ACCESS_POLICY).ok().as_deref())
            .map_err(|message| crate::config::ConfigError::Invalid { name: ACCESS_POLICY, message })
    }

    /// An IAM caller: its canonical ARN (None: no identity at all).
    pub fn iam(&self, principal: Option<&str>) -> Caller {
        let admin = self.iam_admins.iter().any(|entry| match principal {
            _ if entry == "*" => true,
            Some(arn) => entry == arn || role_name(arn) == Some(entry.as_str()),
            None => false,
        });
        let operator = match principal {
            Some(arn) => self.operators.iter().any(|entry| entry == arn || role_name(arn) == Some(entry.as_str())),
            None => self.unauthenticated_operator,
        };
        Caller {
            principal: principal.map(str::to_owned),
            kind: CallerKind::Iam,
            sub: principal.map(str::to_owned),
            admin,
            operator,
        }
    }

    /// Whether a token's claims make its holder an operator: one of `operatorGroups` in its
    /// `cognito:groups` or `groups` claim.
    pub fn is_operator_claims(&self, claims: &Value) -> bool {
        in_groups(claims, &self.operator_groups)
    }

    /// Whether a token's claims make its holder an admin.
    pub fn is_admin_claims(&self, claims: &Value) -> bool {
        let in_group = in_groups(claims, &self.admin_groups);
        let flag = &claims[self.admin_claim.as_str()];
        let flagged = !self.admin_claim.is_empty() && (flag == &Value::Bool(true) || flag.as_str() == Some("true"));
        in_group || flagged
    }

    /// Whether `caller` may follow, or read through a refusal, the item `entityId = id` of `table`.
    pub fn may_read(&self, caller: &Caller, table: &str, id: &str) -> bool {
        caller.admin || (caller.owns(id) && self.read_tables.as_ref().is_none_or(|t| t.iter().any(|t| t == table)))
    }

    /// Whether `caller` may see a transaction recorded with `principal` (GET, `tx:` topic, its held routes).
    pub fn may_see(&self, caller: &Caller, principal: Option<&str>) -> bool {
        caller.admin || (caller.principal.is_some() && caller.principal.as_deref() == principal)
    }

    fn may_write_service(&self, service: &str) -> bool {
        self.write_services.as_ref().is_none_or(|s| s.iter().any(|s| s == service))
    }

    /// Whether non-admins may credit `field` of `service`'s items they do not own.
    pub fn may_credit(&self, service: &str, field: &str) -> bool {
        match &self.allow_credits {
            Credits::Fields(fields) => fields.get(service).is_some_and(|f| f.iter().any(|f| f == field)),
            Credits::Any(allowed) => *allowed && self.may_write_service(service),
        }
    }

    /// What the policy lets a non-admin credit, as a refusal says it.
    fn credits_allowed(&self) -> String {
        match &self.allow_credits {
            _ if !self.allow_credits.any() => String::new(),
            Credits::Fields(fields) => format!(
                ", and credit others' items (add with a positive delta from 0.000001 to under 10^20) on these \
                 fields only: {}",
                fields
                    .iter()
                    .filter(|(_, f)| !f.is_empty())
                    .map(|(service, f)| format!("{service}: {}", f.join(", ")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Credits::Any(_) => format!(
                ", and credit others' items (add with a positive delta from 0.000001 to under 10^20){}",
                match &self.write_services {
                    Some(services) => format!(" of the services {}", services.join(", ")),
                    None => String::new(),
                }
            ),
        }
    }

    /// Whether `caller` may write or guard `operation` on `service`'s item; `Err` says why not. A
    /// service's own operation kinds are its participant's to judge only when the policy says the service
    /// authorizes its callers itself (`selfAuthorizingServices`).
    pub fn check_operation(
        &self,
        caller: &Caller,
        service: &str,
        operation: &Operation,
        path: &str,
    ) -> Result<Allowed, Refusal> {
        let judged_by_service = matches!(operation, Operation::Custom { .. })
            && self.self_authorizing_services.iter().any(|s| s == service);
        if caller.admin || judged_by_service {
            return Ok(Allowed::Unchecked);
        }
        let id = entity_id(operation.key());
        let owned = caller.owns(&id) && self.may_write_service(service);
        if owned {
            return Ok(Allowed::Owned);
        }
        let guarded = match operation {
            Operation::Check { .. } => true,
            Operation::Add { min, max, .. } => min.is_some() || max.is_some(),
            _ => false,
        };
        if guarded {
            return Err(Invalid::new(
                ErrorCode::GuardNotAllowed,
                format!(
                    "{path}: a guard ({}) on an item you may not read; only the item's owner may guard it",
                    guard_names(operation)
                ),
            ));
        }
        if let Operation::Add { delta, field, .. } = operation
            && self.may_credit(service, field)
            && is_credit(delta.value())
        {
            return Ok(Allowed::Credit);
        }
        Err(Invalid::new(
            ErrorCode::Forbidden,
            format!(
                "{path}: {} on {service}'s item {id:?} is not allowed for you: you may write only the items \
                 you own (entityId {owned_ids}){credits}",
                operation.kind(),
                owned_ids = match &caller.sub {
                    Some(sub) => format!("{sub:?} or \"{sub}#...\""),
                    None => "of your own; this request has no identity".to_owned(),
                },
                credits = self.credits_allowed(),
            ),
        ))
    }

    /// Every operation of a request, before anything is written.
    pub fn check_request(&self, caller: &Caller, request: &TransactionRequest) -> Result<(), Refusal> {
        if caller.admin {
            return Ok(());
        }
        for (p, part) in request.participants.iter().enumerate() {
            for (o, operation) in part.operations.iter().enumerate() {
                let path = format!("participants[{p}].operations[{o}]");
                let allowed = self.check_operation(caller, &part.service, operation, &path)?;
                // A held credit holds the owner's item for the whole hold (its debits and puts are refused
                // CONFLICT), and its abort costs the caller nothing: a freeze, not a credit.
                if allowed == Allowed::Credit
                    && let Some(hold_ms) = request.hold_ms
                {
                    return Err(Invalid::new(
                        ErrorCode::HeldCreditNotAllowed,
                        format!(
                            "{path}: a credit to {}'s item {:?}, which you do not own, in a held request (holdMs \
                             {hold_ms}): a held credit would lock the owner's item until the hold ends; credit \
                             others in a request without holdMs",
                            part.service,
                            entity_id(operation.key()),
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What a caller who may not read a refusing participant's items is told in place of its reason.
pub const HIDDEN_REASON: &str = "refused; the reason is shown only to callers who may read the items";

impl Policy {
    /// A transaction's answer as `caller` may see it: the codes always, but a participant's reason (free
    /// text that may quote the items' values) only when the caller may read every item it touched
    /// (`items`: per participant, in the answer's order, the `entityId`s of its operations). The
    /// transaction's own reason, built from those, is rebuilt from what is shown.
    pub fn redact_answer(&self, caller: &Caller, body: &mut Value, items: &[Vec<String>]) {
        if caller.admin {
            return;
        }
        let Some(participants) = body.get_mut("participants").and_then(Value::as_array_mut) else {
            return;
        };
        let mut hidden = false;
        for (entry, ids) in participants.iter_mut().zip(items) {
            if entry.get("reason").is_some() && !ids.iter().all(|id| caller.owns(id)) {
                entry["reason"] = Value::String(HIDDEN_REASON.to_owned());
                hidden = true;
            }
        }
        let shown: Vec<String> = participants
            .iter()
            .filter_map(|p| Some(format!("{}: {}", p["service"].as_str()?, p.get("reason")?.as_str()?)))
            .collect();
        if hidden && body.get("reason").is_some() {
            body["reason"] = Value::String(if shown.is_empty() { HIDDEN_REASON.to_owned() } else { shown.join("; ") });
        }
    }
}

/// What a refusal shown to a non-admin says in place of `transaction <id>` when that transaction is not
/// one the caller may see ([`Policy::may_see`]): whose lock is in the way is no business of the caller's,
/// and an id is what a forged retry would aim at.
pub const ANOTHER_CALLERS_TRANSACTION: &str = "another caller's transaction";

/// The transaction ids an answer's reasons name (`transaction <id>`: how a participant names a lock's
/// owner: CONFLICT, TIMEOUT, "still deciding", held), the answer's own id excepted.
pub fn transactions_named(body: &Value) -> std::collections::BTreeSet<String> {
    let own = body.get("transactionId").and_then(Value::as_str);
    reasons(body)
        .flat_map(|reason| mentions(reason).map(|(_, id)| id.to_owned()).collect::<Vec<_>>())
        .filter(|id| Some(id.as_str()) != own)
        .collect()
}

/// The answer with each of `hidden` named as [`ANOTHER_CALLERS_TRANSACTION`] instead, in the
/// participants' reasons and the transaction's.
pub fn hide_transactions(body: &mut Value, hidden: &std::collections::BTreeSet<String>) {
    if hidden.is_empty() {
        return;
    }
    let hide = |reason: &mut Value| {
        let Some(text) = reason.as_str() else { return };
        let mut shown = String::with_capacity(text.len());
        let mut rest = 0;
        for (at, id) in mentions(text) {
            if hidden.contains(id) {
                shown.push_str(&text[rest..at]);
                shown.push_str(ANOTHER_CALLERS_TRANSACTION);
                rest = at + MENTION.len() + id.len();
            }
        }
        shown.push_str(&text[rest..]);
        *reason = Value::String(shown);
    };
    if let Some(reason) = body.get_mut("reason") {
        hide(reason);
    }
    for entry in body.get_mut("participants").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(reason) = entry.get_mut("reason") {
            hide(reason);
        }
    }
}

const MENTION: &str = "transaction ";

/// Each `transaction <id>` of a text: where the mention starts, and the id (a transaction id's
/// characters: letters, digits, `-`, `_` and `~`).
fn mentions(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.match_indices(MENTION).filter_map(move |(at, _)| {
        let start = at + MENTION.len();
        let tail = &text[start..];
        // `~`: a one-phase transaction's id carries its service (`1p~<service>~...`, coordinator::one_phase_id).
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '~')).unwrap_or(tail.len());
        (end > 0).then(|| (at, &tail[..end]))
    })
}

fn reasons(body: &Value) -> impl Iterator<Item = &str> {
    let participants = body.get("participants").and_then(Value::as_array).into_iter().flatten();
    body.get("reason").and_then(Value::as_str).into_iter().chain(participants.filter_map(|p| p.get("reason")?.as_str()))
}

/// The `entityId`s an operation list touches.
pub fn entity_ids(operations: &[crate::model::Operation]) -> Vec<String> {
    operations.iter().map(|op| entity_id(op.key())).collect()
}

/// The `entityId` of a key ("" when it has no string one: nobody owns that item).
pub fn entity_id(key: &crate::model::Key) -> String {
    key.get(item_attr::KEY).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// A credit to an item the caller may not read: a positive delta from 10^-6 to under 10^20. An add whose
/// result DynamoDB cannot hold (38 significant digits) is refused, so an unbounded credit would be a guard
/// after all: a delta near 10^38 less a guess, or a tiny one, would tell the balance's magnitude.
fn is_credit(delta: &bigdecimal::BigDecimal) -> bool {
    use bigdecimal::BigDecimal;
    let smallest = BigDecimal::new(1.into(), 6);
    let bound = BigDecimal::new(1.into(), -20);
    delta >= &smallest && delta < &bound && delta.with_scale(6) == *delta
}

fn guard_names(operation: &Operation) -> String {
    match operation {
        Operation::Check { .. } => "check".to_owned(),
        Operation::Add { min, max, .. } => [min.as_ref().map(|_| "min"), max.as_ref().map(|_| "max")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    }
}

/// The role an IAM ARN names: `...:assumed-role/<role>` or `...:role/<path>/<role>`.
fn role_name(arn: &str) -> Option<&str> {
    let (_, rest) = arn.split_once(":assumed-role/").or_else(|| arn.split_once(":role/"))?;
    Some(rest.split('/').next_back().unwrap_or(rest)).filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests;
