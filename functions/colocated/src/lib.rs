//! The co-located bootstrap: one Lambda serving several workers, named by
//! `HARNESS_COLOCATED_WORKERS` (their binaries' names, comma-separated; the template
//! `engine-gateway colocate` writes from `harness.yaml`'s `lambda.colocate` sets it). Calls
//! between them run in process (`harness_sdk::colocated`); the rest of the bus is the AWS
//! one every worker Lambda has.
//!
//! Only the workers that need nothing of their own may share: providers (their keys), tools
//! and MCP (their sandbox and processes), and Slack (its Function URL) keep their Lambdas.

use harness_sdk::Worker;

/// The workers this bootstrap can serve, by their binaries' names (each a cargo feature of
/// the same name, all on by default; [`built`] says which this build has).
pub const WORKERS: &[&str] = &[
    "turn-orchestrator",
    "harness-worker",
    "approval-gate",
    "session",
    "llm-budget",
    "hook-fanout",
    "auth-credentials",
    "models-catalog",
    "directory",
    "context-compaction",
];

/// The workers this build serves: its features' ([`WORKERS`] in a default build).
pub fn built() -> Vec<&'static str> {
    [
        ("turn-orchestrator", cfg!(feature = "turn-orchestrator")),
        ("harness-worker", cfg!(feature = "harness-worker")),
        ("approval-gate", cfg!(feature = "approval-gate")),
        ("session", cfg!(feature = "session")),
        ("llm-budget", cfg!(feature = "llm-budget")),
        ("hook-fanout", cfg!(feature = "hook-fanout")),
        ("auth-credentials", cfg!(feature = "auth-credentials")),
        ("models-catalog", cfg!(feature = "models-catalog")),
        ("directory", cfg!(feature = "directory")),
        ("context-compaction", cfg!(feature = "context-compaction")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// What keeps running beside the workers (a permissions file's watch), held as long as they
/// are served.
pub type Guards = Vec<tokio::task::JoinHandle<()>>;

/// `HARNESS_COLOCATED_WORKERS` read: the names, checked.
pub fn names_from(value: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Err(format!(
            "HARNESS_COLOCATED_WORKERS names no worker (any of: {})",
            WORKERS.join(", ")
        ));
    }
    for (i, n) in names.iter().enumerate() {
        if !WORKERS.contains(&n.as_str()) {
            return Err(format!(
                "HARNESS_COLOCATED_WORKERS: `{n}` is not a worker this bootstrap serves (any of: {})",
                WORKERS.join(", ")
            ));
        }
        if names[..i].contains(n) {
            return Err(format!("HARNESS_COLOCATED_WORKERS names `{n}` twice"));
        }
        if !built().contains(&n.as_str()) {
            return Err(format!(
                "HARNESS_COLOCATED_WORKERS: `{n}` is not in this build (built with: {}); build it with `--features {n}`",
                built().join(", ")
            ));
        }
    }
    Ok(names)
}

/// One worker as its own binary builds it, from the environment.
async fn member(name: &str, guards: &mut Guards) -> Result<Worker, String> {
    let _ = &guards;
    Ok(match name {
        #[cfg(feature = "turn-orchestrator")]
        "turn-orchestrator" => turn_orchestrator::worker(),
        #[cfg(feature = "harness-worker")]
        "harness-worker" => {
            let (worker, watch) = harness_worker::from_env().await?;
            guards.extend(watch);
            worker
        }
        #[cfg(feature = "approval-gate")]
        "approval-gate" => approval_gate::worker(),
        #[cfg(feature = "session")]
        "session" => session_worker::worker(),
        #[cfg(feature = "llm-budget")]
        "llm-budget" => llm_budget::worker(),
        #[cfg(feature = "hook-fanout")]
        "hook-fanout" => hook_fanout::worker(),
        #[cfg(feature = "auth-credentials")]
        "auth-credentials" => auth_credentials::worker(auth_credentials::Auth::new(
            harness_sdk::secrets_from_env().await,
            auth_credentials::Auth::process_env(),
        )),
        #[cfg(feature = "models-catalog")]
        "models-catalog" => {
            let catalog = match std::env::var("MODELS_CATALOG") {
                Ok(path) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("MODELS_CATALOG {path}: {e}"))?;
                    models_catalog::Catalog::parse(&text)
                        .map_err(|e| format!("MODELS_CATALOG {path}: {e}"))?
                }
                Err(_) => models_catalog::Catalog::builtin(),
            };
            models_catalog::worker(std::sync::Arc::new(catalog))
        }
        #[cfg(feature = "directory")]
        "directory" => directory::worker(),
        #[cfg(feature = "context-compaction")]
        "context-compaction" => context_compaction::worker(),
        other => return Err(format!("`{other}` is not a worker this bootstrap serves")),
    })
}

/// The named workers served as one (`group` is the Lambda's name, for its logs).
pub async fn colocated(group: &str, names: &[String]) -> Result<(Worker, Guards), String> {
    let mut guards = Guards::new();
    let mut members = Vec::with_capacity(names.len());
    for name in names {
        members.push(member(name, &mut guards).await?);
    }
    Ok((Worker::colocate(group, members)?, guards))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(
            names_from(" turn-orchestrator, session ,").unwrap(),
            ["turn-orchestrator", "session"]
        );
        let e = names_from("session,tools-worker").unwrap_err();
        assert!(
            e.contains("`tools-worker` is not a worker this bootstrap serves"),
            "{e}"
        );
        assert!(names_from(" , ").unwrap_err().contains("names no worker"));
        assert!(
            names_from("session,session")
                .unwrap_err()
                .contains("`session` twice")
        );
    }

    #[test]
    fn it_serves_what_the_template_writer_may_group() {
        assert_eq!(
            WORKERS,
            aws_local::colocate::shareable_binaries().as_slice()
        );
        // A default build has every worker's feature, named as the worker is.
        assert_eq!(built(), WORKERS);
    }

    #[tokio::test]
    async fn every_worker_it_serves_builds_and_none_shares_a_function_id() {
        let all: Vec<String> = WORKERS.iter().map(|s| s.to_string()).collect();
        let (worker, _guards) = colocated("core", &all).await.unwrap();
        assert_eq!(worker.members().len(), WORKERS.len());
        for id in [
            "run::start",
            "policy::check_permissions",
            "session-tree::append_batch",
            "approval::resolve",
        ] {
            assert!(worker.handler(id).is_some(), "{id}");
        }
        // Each function's spans keep its own worker's name.
        let spec = worker
            .functions()
            .iter()
            .find(|f| f.def.id == "session-tree::append_batch")
            .unwrap();
        assert_ne!(spec.service.as_deref(), Some("core"));
    }
}
