//! `docs/ARCHITECTURE.md` stays true: its crate-dependency table is exactly what
//! `cargo metadata` says each crate of ours depends on (normal dependencies), and no crate but
//! the DSH adapter (and the programs above it) reaches DSH.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("examples/ sits in the workspace")
}

/// The table between the `crate-deps` markers.
fn documented() -> Graph {
    let doc = std::fs::read_to_string(workspace().join("docs/ARCHITECTURE.md")).unwrap();
    let start = doc
        .find("<!-- crate-deps:begin -->")
        .expect("the begin marker");
    let end = doc.find("<!-- crate-deps:end -->").expect("the end marker");
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|c| c.trim().trim_matches('`').to_owned())
            .filter(|c| !c.is_empty() && c != "—")
            .collect()
    };
    doc[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), names(cells[2]))
        })
        .collect()
}

/// Each workspace crate's normal dependencies among the workspace's crates.
fn actual() -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| ours.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn the_documented_crate_graph_is_the_real_one() {
    let (doc, real) = (documented(), actual());
    assert!(doc.len() >= 9, "the table lists every crate: {doc:?}");
    for (name, deps) in &real {
        let Some(written) = doc.get(name) else {
            panic!("docs/ARCHITECTURE.md does not list {name} (it depends on {deps:?})");
        };
        assert_eq!(
            written, deps,
            "docs/ARCHITECTURE.md says {name} depends on {written:?}; Cargo.toml says {deps:?}"
        );
    }
    for name in doc.keys() {
        assert!(
            real.contains_key(name),
            "{name} is documented but is no crate"
        );
    }
}

#[test]
fn only_the_dsh_adapter_and_programs_above_it_reach_dsh() {
    let real = actual();
    let reaching: BTreeSet<&str> = real
        .iter()
        .filter(|(_, deps)| deps.contains("tavern-dsh-adapter"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        reaching,
        BTreeSet::from(["tavern-cli", "tavern-examples"]),
        "a library depends on the DSH adapter"
    );
    // And no library but the adapter decodes DSH's envelope.
    for krate in [
        "tavern-core",
        "tavern-search",
        "tavern-store",
        "tavern-tools",
        "tavern-projector",
        "tavern-runtime",
    ] {
        for file in sources(&workspace().join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                !text.contains("dsh::event") && !text.contains("tavern_dsh_adapter"),
                "{} knows DSH's envelope",
                file.display()
            );
        }
    }
}

fn sources(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}
