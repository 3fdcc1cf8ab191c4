//! Every `cargo run --release -p twopc-bench [--bin twopc-cold-start] -- ...` line the docs give is a
//! command that binary takes: each is run with `--help` added (which parses its flags, then stops), so a
//! renamed flag fails here instead of on a reader's machine.
//!
//! It is also why `cargo test --workspace` builds `twopc-bench` itself: CI's smoke run then finds it
//! built with the tests' own features, and does not build it a second time.

use std::path::Path;
use std::process::Command;

const INVOCATION: &str = "-p twopc-bench";
const DOCS: [&str; 2] = ["README.md", "BENCHMARKS.md"];

#[test]
fn every_command_the_docs_give_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut commands: Vec<(&str, &str, Vec<String>)> = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for line in text.lines().filter(|line| line.contains("cargo run")) {
            let Some(at) = line.find(INVOCATION) else { continue };
            // Its own flags follow `--`; the command ends where its code span or shell comment does.
            let rest = line[at + INVOCATION.len()..].split(['`', '#']).next().unwrap_or_default();
            let (cargo_flags, args): (&str, Vec<String>) = match rest.split_once(" -- ") {
                Some((cargo_flags, flags)) => (cargo_flags, flags.split_whitespace().map(str::to_owned).collect()),
                None => (rest, vec![]),
            };
            let binary = if cargo_flags.contains("--bin twopc-cold-start") {
                env!("CARGO_BIN_EXE_twopc-cold-start")
            } else {
                assert!(!cargo_flags.contains("--bin"), "{doc}: a binary this test does not know: {line}");
                env!("CARGO_BIN_EXE_twopc-bench")
            };
            commands.push((doc, binary, args));
        }
    }
    assert!(
        commands.iter().any(|(_, _, args)| args.iter().any(|a| a == "--only")),
        "the docs show how to run one scenario (`--only`): {commands:?}"
    );
    assert!(
        commands.iter().any(|(_, binary, _)| binary.ends_with("twopc-cold-start")),
        "the docs show how to measure the cold starts: {commands:?}"
    );
    for (doc, binary, args) in &commands {
        let output = Command::new(binary).args(args).arg("--help").output().expect("twopc-bench runs");
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("Usage:"),
            "{doc}: `{binary} {}` does not parse: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
