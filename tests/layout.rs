//! The workspace's shape, as issue 47 set it: crates small enough to find one's way in, no
//! import cycle between the top-level modules of a crate, a README per crate naming what it
//! owns and what it must not depend on, and Lambda bootstraps that link only what they run
//! (no redb, no console, no local emulators of AWS).

use crate::workspace;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of Rust in one crate's `src/`.
const MAX_CRATE_LINES: usize = 8_000;

/// What no Lambda bootstrap may link: the embedded store (redb and its write-ahead log), the
/// local emulators of AWS, and the engine binary that composes them.
const NEVER_IN_A_LAMBDA: [&str; 4] = ["redb", "store-embedded", "aws-local", "engine-gateway"];

/// What a worker's bootstrap may not link besides: the edge, which carries the console's
/// assets (the doors Lambda, `engine-aws`, serves the edge's doors and links it).
const NEVER_IN_A_WORKER: [&str; 1] = ["bus-edge"];

/// Every crate directory: the bus crates, the workers, the engine binary and the harness.
fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs = workspace::crate_dirs();
    dirs.push(PathBuf::from("."));
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_crate_passes_eight_thousand_lines() {
    let mut sizes = Vec::new();
    for dir in crate_dirs() {
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        let lines: usize = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
            .sum();
        sizes.push((dir.display().to_string(), lines));
    }
    let over: Vec<_> = sizes.iter().filter(|(_, n)| *n > MAX_CRATE_LINES).collect();
    assert!(
        over.is_empty(),
        "crates over {MAX_CRATE_LINES} lines: {over:?}"
    );
}

/// The top-level module a file of `src/` belongs to (`None`: the crate root or a binary).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?;
    if matches!(name, "lib.rs" | "main.rs" | "bin") {
        return None;
    }
    Some(name.trim_end_matches(".rs").to_string())
}

/// The crate-level modules a file's code names (`crate::x`, `crate::{x, y::z}`), comments
/// left out.
fn modules_named(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let single = regex::Regex::new(r"(?:^|[^\w$])crate::([a-z_][a-z0-9_]*)").unwrap();
    let group = regex::Regex::new(r"(?:^|[^\w$])crate::\{([^}]*)\}").unwrap();
    let name = regex::Regex::new(r"^\s*([a-z_][a-z0-9_]*)").unwrap();
    let mut out: BTreeSet<String> = single
        .captures_iter(&code)
        .map(|c| c[1].to_string())
        .collect();
    for g in group.captures_iter(&code) {
        for part in g[1].split(',') {
            if let Some(c) = name.captures(part) {
                out.insert(c[1].to_string());
            }
        }
    }
    out
}

/// The cycles (strongly connected sets of two or more modules) of a module graph.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // Two modules are in one cycle when each reaches the other.
    let reach = |from: &String| -> BTreeSet<String> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (m, r) in &reached {
        let set: BTreeSet<String> = r
            .iter()
            .filter(|n| *n != *m && reached.get(n).is_some_and(|back| back.contains(*m)))
            .cloned()
            .chain([(*m).clone()])
            .collect();
        if set.len() > 1 && !out.contains(&set) {
            out.push(set);
        }
    }
    out
}

#[test]
fn no_import_cycle_between_the_modules_of_a_crate() {
    let mut found = Vec::new();
    for dir in crate_dirs() {
        let src = dir.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let Some(me) = top_module(&src, f) else {
                continue;
            };
            let named = modules_named(&std::fs::read_to_string(f).unwrap());
            edges
                .entry(me.clone())
                .or_default()
                .extend(named.into_iter().filter(|n| *n != me));
        }
        let modules: BTreeSet<String> = edges.keys().cloned().collect();
        for targets in edges.values_mut() {
            targets.retain(|t| modules.contains(t));
        }
        for c in cycles(&edges) {
            found.push(format!("{}: {c:?}", dir.display()));
        }
    }
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    // The check above cannot pass by finding nothing.
    let named = modules_named("use crate::{a, b::X};\n// crate::c\nfn f() { crate::d::g() }");
    assert_eq!(named, BTreeSet::from(["a".into(), "b".into(), "d".into()]));
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        cycles(&edges),
        vec![BTreeSet::from(["a".into(), "b".into(), "c".into()])]
    );
}

#[test]
fn every_bus_crate_has_a_readme_naming_what_it_owns_and_must_not_depend_on() {
    for dir in crate_dirs()
        .into_iter()
        .filter(|d| d.starts_with("crates") || d.ends_with("engine-gateway"))
    {
        let readme = std::fs::read_to_string(dir.join("README.md"))
            .unwrap_or_else(|_| panic!("{} has no README.md", dir.display()));
        for heading in ["## Owns", "## Must not depend on"] {
            assert!(
                readme.contains(heading),
                "{}/README.md has no `{heading}` section",
                dir.display()
            );
        }
    }
}

/// `cargo metadata`'s resolved graph: package name → the names it depends on for building its
/// library and binaries (no dev or build dependencies), for the platform the bootstraps are
/// built for. Filtered by platform, it reads only packages a build here downloaded: a fresh
/// machine has no other platform's crates (`--offline` would fail on them).
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", "x86_64-unknown-linux-gnu"])
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps: BTreeSet<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| names[d["pkg"].as_str().unwrap()].to_string())
            .collect();
        graph.insert(names[node["id"].as_str().unwrap()].to_string(), deps);
    }
    graph
}

/// Everything `package` links, itself included.
fn linked(graph: &BTreeMap<String, BTreeSet<String>>, package: &str) -> BTreeSet<String> {
    let (mut seen, mut todo) = (BTreeSet::from([package.to_string()]), vec![package]);
    while let Some(p) = todo.pop() {
        for d in graph.get(p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    seen
}

/// The packages that build Lambda bootstraps (they carry `cargo lambda deploy` settings).
fn lambda_packages() -> Vec<(String, PathBuf)> {
    crate_dirs()
        .into_iter()
        .filter_map(|dir| {
            let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
            text.contains("[package.metadata.lambda.deploy]")
                .then_some(())?;
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))?
                .trim_end_matches('"')
                .to_string();
            Some((name, dir))
        })
        .collect()
}

#[test]
fn lambda_bootstraps_link_neither_redb_nor_the_console_nor_the_emulators() {
    let graph = normal_dependencies();
    let lambdas = lambda_packages();
    // The check has something to check: every worker and the engine's own Lambdas.
    assert!(lambdas.len() >= 18, "Lambda packages: {lambdas:?}");
    assert!(lambdas.iter().any(|(n, _)| n == "engine-aws"));
    let mut wrong = Vec::new();
    for (name, dir) in &lambdas {
        let links = linked(&graph, name);
        let worker = dir.starts_with("functions");
        for never in NEVER_IN_A_LAMBDA.iter().chain(
            worker
                .then_some(NEVER_IN_A_WORKER.iter())
                .into_iter()
                .flatten(),
        ) {
            if links.contains(*never) {
                wrong.push(format!("{name} links {never}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // And the graph is read right: the engine binary does link them all.
    let engine = linked(&graph, "engine-gateway");
    for p in NEVER_IN_A_LAMBDA.iter().chain(&NEVER_IN_A_WORKER) {
        assert!(
            engine.contains(*p) || *p == "engine-gateway",
            "engine-gateway should link {p}"
        );
    }
}
