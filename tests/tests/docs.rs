//! What the docs show is what the code is: README.md's "Write your own participant" example is the
//! example crate `cargo test` compiles (`functions/participant/examples/accounts.rs`), line for line.

#[test]
fn the_readme_participant_example_is_the_compiled_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("functions/participant/examples/accounts.rs")).unwrap();
    let section = readme.split("## Write your own participant").nth(1).expect("the section");
    let block = section.split("```rust,ignore\n").nth(1).and_then(|b| b.split("```").next()).expect("its rust block");
    assert_eq!(block, example, "README.md's example differs from functions/participant/examples/accounts.rs");
}
