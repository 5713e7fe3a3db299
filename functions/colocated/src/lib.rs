//! The co-located bootstrap: one Lambda serving several workers, named by
//! `HARNESS_COLOCATED_WORKERS` (their binaries' names, comma-separated; the template
//! `engine-gateway colocate` writes from `harness.yaml`'s `lambda.colocate` sets it). Calls
//! between them run in process (`harness_sdk::colocated`); the rest of the bus is the AWS
//! one every worker Lambda has.
//!
//! Only the workers that need nothing of their own may share: providers (their keys), tools
//! and MCP (their sandbox and processes), and Slack (its Function URL) keep their Lambdas.

use harness_sdk::Worker;

/// The workers this bootstrap can serve, by their binaries' names.
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
    }
    Ok(names)
}

/// One worker as its own binary builds it, from the environment.
async fn member(name: &str, guards: &mut Guards) -> Result<Worker, String> {
    Ok(match name {
        "turn-orchestrator" => turn_orchestrator::worker(),
        "harness-worker" => {
            let (worker, watch) = harness_worker::from_env().await?;
            guards.extend(watch);
            worker
        }
        "approval-gate" => approval_gate::worker(),
        "session" => session_worker::worker(),
        "llm-budget" => llm_budget::worker(),
        "hook-fanout" => hook_fanout::worker(),
        "auth-credentials" => auth_credentials::worker(auth_credentials::Auth::new(
            harness_sdk::secrets_from_env().await,
            auth_credentials::Auth::process_env(),
        )),
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
        "directory" => directory::worker(),
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
