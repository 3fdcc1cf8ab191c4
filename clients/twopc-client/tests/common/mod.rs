//! Test support: an independent SigV4 (HMAC written out over SHA-256, from the AWS documentation,
//! checked against the AWS signing test suite) to check the client's signatures against.

#![allow(dead_code)]

use sha2::{Digest, Sha256};

pub const ACCESS_KEY: &str = "AKIDEXAMPLE";
pub const SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(data).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().to_vec()
}

/// The signature of a canonical request at `amz_date` (`YYYYMMDDTHHMMSSZ`).
pub fn signature(secret: &str, amz_date: &str, region: &str, service: &str, canonical_request: &str) -> String {
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", sha256_hex(canonical_request.as_bytes()));
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    hex::encode(hmac(&key, string_to_sign.as_bytes()))
}

/// `method\npath\nquery\nheaders\n\nsigned\nbody-hash`; `headers` are the signed ones, lower-case names.
pub fn canonical_request(method: &str, path: &str, query: &str, headers: &[(String, String)], body: &[u8]) -> String {
    let mut headers = headers.to_vec();
    headers.sort();
    let lines: String = headers.iter().map(|(n, v)| format!("{n}:{}\n", v.trim())).collect();
    let signed: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    format!("{method}\n{path}\n{query}\n{lines}\n{}\n{}", signed.join(";"), sha256_hex(body))
}

/// SigV4's encoding: unreserved characters as they are, every other byte as %XX.
pub fn uri_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// The `Authorization` header's parts: (credential, signed header names, signature).
pub fn authorization_parts(header: &str) -> (String, Vec<String>, String) {
    let rest = header.strip_prefix("AWS4-HMAC-SHA256 ").expect("the SigV4 algorithm");
    let mut parts = std::collections::BTreeMap::new();
    for part in rest.split(", ") {
        let (name, value) = part.split_once('=').unwrap();
        parts.insert(name, value);
    }
    (
        parts["Credential"].to_owned(),
        parts["SignedHeaders"].split(';').map(str::to_owned).collect(),
        parts["Signature"].to_owned(),
    )
}

/// Checks a request's SigV4 `Authorization` as API Gateway would: the signature recomputed from the
/// request as received. `header` looks a header up by its lower-case name.
pub fn verify(
    method: &str,
    path: &str,
    header: impl Fn(&str) -> Option<String>,
    body: &[u8],
    region: &str,
) -> Result<(), String> {
    let authorization = header("authorization").ok_or("no authorization header")?;
    let (credential, signed, given) = authorization_parts(&authorization);
    let amz_date = header("x-amz-date").ok_or("no x-amz-date")?;
    let scope = format!("{ACCESS_KEY}/{}/{region}/execute-api/aws4_request", &amz_date[..8]);
    if credential != scope {
        return Err(format!("credential {credential}, expected {scope}"));
    }
    let headers: Vec<(String, String)> = signed
        .iter()
        .map(|name| header(name).map(|v| (name.clone(), v)).ok_or(format!("signed header {name} missing")))
        .collect::<Result<_, _>>()?;
    let expected =
        signature(SECRET_KEY, &amz_date, region, "execute-api", &canonical_request(method, path, "", &headers, body));
    if given == expected { Ok(()) } else { Err(format!("signature {given}, expected {expected}")) }
}
