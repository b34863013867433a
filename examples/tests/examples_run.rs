//! The examples are part of the product: each runs to completion and says what it showed.

use std::process::Command;

fn run(bin: &str) -> String {
    let out = Command::new(bin).output().expect("run the example binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{bin} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_plain_words(bin, &text);
    text
}

/// What a user reads is words, not Rust's debug notation. (Each example empties its own data
/// folder, so each runs in one test only: this check rides along in `run`.)
fn assert_plain_words(bin: &str, out: &str) {
    for debug in ["Some(", "None", "Ok(", "status Ok", "Mounted", "Untouched"] {
        assert!(!out.contains(debug), "{bin} prints {debug:?}:\n{out}");
    }
}

#[test]
fn the_main_session_example_survives_a_restart_without_loss_or_duplicates() {
    let out = run(env!("CARGO_BIN_EXE_tavern-session"));
    assert!(
        out.contains(
            "ok: 5 turns, 10 projected lines, nothing lost or duplicated across the restart"
        ),
        "{out}"
    );
    assert!(
        out.contains("error revision-conflict"),
        "the example shows a conflict: {out}"
    );
    assert!(out.contains("trust = 3"), "and its recovery: {out}");
    assert!(
        out.contains("The model here is scripted"),
        "the example says its model is scripted: {out}"
    );
    assert!(
        out.contains("projection: up to date (host events 0 to "),
        "{out}"
    );
}

#[test]
fn the_st_example_shows_an_untouched_session() {
    let out = run(env!("CARGO_BIN_EXE_st-session"));
    assert!(out.contains("tools offered to the model: 0"), "{out}");
}

#[test]
fn the_agent_managed_example_projects_and_logs_every_request() {
    let out = run(env!("CARGO_BIN_EXE_agent-managed"));
    assert!(out.contains("no agent/context seam"), "{out}");
    assert!(
        out.contains("request/projection events logged: 6; chat lines kept: 13"),
        "{out}"
    );
}

#[test]
fn the_quickstart_prints_a_normalized_binding_and_a_kernel() {
    let out = run(env!("CARGO_BIN_EXE_quickstart"));
    assert!(
        out.contains("legacy binding without architecture; set to st"),
        "{out}"
    );
    assert!(out.contains("# AgentTavern roleplay kernel"), "{out}");
}
