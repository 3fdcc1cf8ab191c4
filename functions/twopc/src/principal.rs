//! The caller's principal, in one canonical form, so that the same caller is always the same string.
//!
//! From an IAM-signed request, API Gateway gives the caller's ARN (`requestContext.identity.userArn`).
//! An assumed role's ARN names the session too (`arn:aws:sts::123456789012:assumed-role/Orders/i-0abc`):
//! the session is dropped (`arn:aws:sts::123456789012:assumed-role/Orders`), so that a retry from a new
//! session of the same role is the same caller. Any other ARN (an IAM user, the account's root) is kept
//! as it is. A request without an identity has no principal.

/// The canonical form of a caller's ARN.
pub fn canonical(arn: &str) -> String {
    match arn.split_once(":assumed-role/") {
        Some((prefix, rest)) => match rest.split_once('/') {
            Some((role, _session)) => format!("{prefix}:assumed-role/{role}"),
            None => arn.to_owned(),
        },
        None => arn.to_owned(),
    }
}

/// The principal of an API Gateway REST request, from its request context's identity.
pub fn of_identity(user_arn: Option<&str>) -> Option<String> {
    user_arn.filter(|arn| !arn.is_empty()).map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assumed_role_is_the_same_caller_in_every_session() {
        assert_eq!(
            canonical("arn:aws:sts::123456789012:assumed-role/Orders/i-0abc"),
            "arn:aws:sts::123456789012:assumed-role/Orders"
        );
        assert_eq!(
            canonical("arn:aws-cn:sts::123456789012:assumed-role/Orders/session-2"),
            "arn:aws-cn:sts::123456789012:assumed-role/Orders"
        );
        assert_eq!(canonical("arn:aws:iam::123456789012:user/ops/alice"), "arn:aws:iam::123456789012:user/ops/alice");
        assert_eq!(canonical("arn:aws:iam::123456789012:root"), "arn:aws:iam::123456789012:root");
        assert_eq!(of_identity(Some("")), None);
    }
}
