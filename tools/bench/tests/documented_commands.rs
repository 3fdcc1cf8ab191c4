//! Every `cargo run --release -p twopc-bench -- ...` line the docs give is a command `twopc-bench`
//! takes: each is run with `--help` added (which parses its flags, then stops), so a renamed flag
//! fails here instead of on a reader's machine.
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
    let mut commands: Vec<(&str, Vec<String>)> = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for line in text.lines().filter(|line| line.contains("cargo run")) {
            let Some(at) = line.find(INVOCATION) else { continue };
            // Its own flags follow `--`; the command ends where its code span or shell comment does.
            let rest = line[at + INVOCATION.len()..].split(['`', '#']).next().unwrap_or_default();
            let args: Vec<String> = match rest.split_once(" -- ") {
                Some((_, flags)) => flags.split_whitespace().map(str::to_owned).collect(),
                None => vec![],
            };
            commands.push((doc, args));
        }
    }
    assert!(
        commands.iter().any(|(_, args)| args.iter().any(|a| a == "--only")),
        "the docs show how to run one scenario (`--only`): {commands:?}"
    );
    for (doc, args) in &commands {
        let output = Command::new(env!("CARGO_BIN_EXE_twopc-bench"))
            .args(args)
            .arg("--help")
            .output()
            .expect("twopc-bench runs");
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("Usage:"),
            "{doc}: `cargo run --release {INVOCATION} -- {}` does not parse: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
