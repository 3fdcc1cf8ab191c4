//! What the docs show is what the code is, and where they point is there: docs/participants.md's
//! example is the example crate `cargo test` compiles (`functions/participant/examples/accounts.rs`),
//! line for line, and every relative link of the docs names a file that exists, and a heading of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_participant_example_is_the_compiled_one() {
    let doc = std::fs::read_to_string(root().join("docs/participants.md")).unwrap();
    let example = std::fs::read_to_string(root().join("functions/participant/examples/accounts.rs")).unwrap();
    let section = doc.split("# Write your own participant").nth(1).expect("the section");
    let block = section.split("```rust,ignore\n").nth(1).and_then(|b| b.split("```").next()).expect("its rust block");
    assert_eq!(
        block, example,
        "docs/participants.md's example differs from functions/participant/examples/accounts.rs"
    );
}

/// The docs whose links are checked: the README, everything in docs/, and the docs beside the code.
fn linked_docs() -> Vec<String> {
    let mut docs: Vec<String> =
        ["README.md", "BENCHMARKS.md", "infra/DEPLOY.md", "tools/model/README.md", "tools/model/DETAILS.md"]
            .map(str::to_owned)
            .into();
    let mut in_docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// A Markdown file's lines outside fenced code blocks, with their line numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, every other character but letters, digits,
/// `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, a repeated one numbered as GitHub numbers it (`-1`, `-2`).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = Vec::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ').filter(|_| (1..=6).contains(&hashes)) else { continue };
        let base = slug(title.trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(if *count == 0 { base.clone() } else { format!("{base}-{count}") });
        *count += 1;
    }
    anchors
}

/// The targets of a line's inline links and images (`[text](target)`, `![alt](target)`), code spans
/// left out.
fn link_targets(line: &str) -> Vec<String> {
    // Code spans blanked (same length), so that a `](` inside one is not taken for a link.
    let mut plain = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            plain.push('`');
        } else {
            plain.push(if in_code { 'x' } else { c });
        }
    }
    plain
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &plain[at + 2..];
            let end = rest.find(')')?;
            // A title (`(target "title")`) follows the target after a blank.
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            Some(target.trim_start_matches('<').trim_end_matches('>').to_owned())
        })
        .collect()
}

#[test]
fn every_relative_link_of_the_docs_points_at_a_file_and_a_heading_that_exist() {
    let root = root().canonicalize().expect("the workspace");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in linked_docs() {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let dir = root.join(&doc).parent().expect("a doc's folder").to_path_buf();
        for (line, content) in prose(&text) {
            for target in link_targets(content) {
                if target.is_empty()
                    || ["http://", "https://", "mailto:"].iter().any(|scheme| target.starts_with(scheme))
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() { root.join(&doc) } else { dir.join(path) };
                if !file.exists() {
                    broken.push(format!("{doc}:{line}: ({target}): no file {}", file.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.extension().is_none_or(|ext| ext != "md") {
                    continue;
                }
                let linked = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                if !anchors(&linked).iter().any(|a| a == anchor) {
                    broken.push(format!("{doc}:{line}: ({target}): no heading #{anchor} in {}", file.display()));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found: is the parser still reading the docs?");
    assert!(broken.is_empty(), "{} broken link(s):\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn a_heading_anchors_as_github_anchors_it() {
    assert_eq!(slug("Tokens: `up --auth jwt`"), "tokens-up---auth-jwt");
    assert_eq!(slug("Resources beyond DynamoDB: try, confirm, cancel"), "resources-beyond-dynamodb-try-confirm-cancel");
    assert_eq!(
        slug("Who may write a decision, and what a commit applies"),
        "who-may-write-a-decision-and-what-a-commit-applies"
    );
    assert_eq!(slug("Fan-out (scenario 6)"), "fan-out-scenario-6");
    assert_eq!(slug("Größe & Ünïcode_x"), "größe--ünïcode_x");
    assert_eq!(anchors("# A\n```\n# not a heading\n```\n## A\n"), ["a", "a-1"]);
    assert_eq!(
        link_targets("see [`x`](a.md#b), ![img](p.png \"t\"), `[not](code)` and <https://x> [web](https://y)"),
        ["a.md#b", "p.png", "https://y"]
    );
}
