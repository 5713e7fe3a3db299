//! Every AWS API call this process makes, counted by service and operation (one count per
//! operation, whatever its retries). An SDK interceptor on every client the backend builds;
//! the figures of `bench/results/aws.md` (calls per tool call) come from here.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use std::collections::BTreeMap;
use std::sync::Mutex;

static COUNTS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// The interceptor to add to a client's configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountCalls;

impl Intercept for CountCalls {
    fn name(&self) -> &'static str {
        "CountCalls"
    }

    // Once per operation, after the operation's own configuration (its `Metadata`) is loaded.
    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let mut key = match cfg.load::<Metadata>() {
            Some(m) => {
                if recording() {
                    crate::iam_calls::note(m.service(), m.name(), context.input());
                }
                format!("{}.{}", m.service(), m.name())
            }
            None => "unknown".to_string(),
        };
        if let Some(label) = item_label(context) {
            key.push_str(&label);
        }
        let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(key).or_default() += 1;
        drop(counts);
        RECORDER.call_once(start_recorder);
        Ok(())
    }
}

/// What a DynamoDB item call touches: ` [scope]` in the state table (its partition key), so
/// the counts say whose writes they are (the turn record, events, the session tree…), else
/// ` (name table)` for the other tables (registry, checkpoints), without the prefix.
fn item_label(context: &BeforeSerializationInterceptorContextRef<'_>) -> Option<String> {
    use aws_sdk_dynamodb::operation::{
        delete_item::DeleteItemInput, get_item::GetItemInput, put_item::PutItemInput,
        query::QueryInput, transact_write_items::TransactWriteItemsInput,
        update_item::UpdateItemInput,
    };
    use aws_sdk_dynamodb::types::AttributeValue;
    type Attrs = std::collections::HashMap<String, AttributeValue>;
    fn scope_of(m: Option<&Attrs>) -> Option<&str> {
        m.and_then(|m| m.get("scope"))
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
    }
    let input = context.input();
    let (table, scope) = if let Some(i) = input.downcast_ref::<GetItemInput>() {
        (i.table_name.as_deref(), scope_of(i.key.as_ref()))
    } else if let Some(i) = input.downcast_ref::<PutItemInput>() {
        (i.table_name.as_deref(), scope_of(i.item.as_ref()))
    } else if let Some(i) = input.downcast_ref::<UpdateItemInput>() {
        (i.table_name.as_deref(), scope_of(i.key.as_ref()))
    } else if let Some(i) = input.downcast_ref::<DeleteItemInput>() {
        (i.table_name.as_deref(), scope_of(i.key.as_ref()))
    } else if let Some(i) = input.downcast_ref::<TransactWriteItemsInput>() {
        // Every scope a transaction writes, in order, once each (`agent + $stream:…`: a
        // record saved with its events).
        let mut table = None;
        let mut scopes: Vec<&str> = Vec::new();
        for t in i.transact_items.as_deref().unwrap_or_default() {
            let (name, scope) = if let Some(u) = &t.update {
                (u.table_name.as_str(), u.key.get("scope"))
            } else if let Some(p) = &t.put {
                (p.table_name.as_str(), p.item.get("scope"))
            } else if let Some(d) = &t.delete {
                (d.table_name.as_str(), d.key.get("scope"))
            } else if let Some(c) = &t.condition_check {
                (c.table_name.as_str(), c.key.get("scope"))
            } else {
                continue;
            };
            table.get_or_insert(name);
            if let Some(scope) = scope.and_then(|v| v.as_s().ok())
                && !scopes.contains(&scope.as_str())
            {
                scopes.push(scope);
            }
        }
        if !scopes.is_empty() {
            return Some(format!(" [{}]", scopes.join(" + ")));
        }
        (table, None)
    } else if let Some(i) = input.downcast_ref::<QueryInput>() {
        // A query's key condition value: the scope (state, `:s`) or the kind (registry).
        let values = i.expression_attribute_values.as_ref();
        let value = values
            .and_then(|m| m.get(":s"))
            .or_else(|| values.and_then(|m| m.values().find(|v| v.is_s())))
            .and_then(|v| v.as_s().ok())
            .map(String::as_str);
        (i.table_name.as_deref(), value)
    } else {
        return None;
    };
    match (scope, table) {
        (Some(scope), _) => Some(format!(" [{scope}]")),
        (None, Some(table)) => Some(format!(
            " ({} table)",
            table.rsplit('-').next().unwrap_or(table)
        )),
        (None, None) => None,
    }
}

static RECORDER: std::sync::Once = std::sync::Once::new();

/// Whether this process records its calls (`HARNESS_API_CALLS_DIR`).
fn recording() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("HARNESS_API_CALLS_DIR").is_some())
}

/// With `HARNESS_API_CALLS_DIR` set, the process keeps its counts in `<dir>/<pid>.json`
/// (rewritten a few times a second), so the calls of processes that are killed rather than
/// ended, such as Lambda bootstraps, can be summed from outside (`bench/aws.sh`), and what
/// they asked IAM for in `<dir>/<pid>.iam` ([`crate::iam_calls`], for `infra/iam_check.py`).
fn start_recorder() {
    let Some(dir) = std::env::var_os("HARNESS_API_CALLS_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let path = dir.join(format!("{}.json", std::process::id()));
    let iam_path = dir.join(format!("{}.iam", std::process::id()));
    let write = |path: &std::path::Path, body: Vec<u8>| {
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, body)
            .and_then(|()| std::fs::rename(&tmp, path))
            .is_err()
        {
            tracing::warn!(path = %path.display(), "API call record not written");
        }
    };
    let spawned = std::thread::Builder::new()
        .name("api-calls".into())
        .spawn(move || {
            let mut written = BTreeMap::new();
            loop {
                let now = snapshot();
                if now != written {
                    write(&path, serde_json::to_vec(&now).unwrap_or_default());
                    write(
                        &iam_path,
                        serde_json::to_vec(&crate::iam_calls::record()).unwrap_or_default(),
                    );
                    written = now;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "API call counts not recorded");
    }
}

/// Sum the counts every process left in `dir` (see [`start_recorder`]), leaving out the
/// processes in `except`.
pub fn sum_recorded(
    dir: &std::path::Path,
    except: &[u32],
) -> std::io::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let pid = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok());
        if pid.is_some_and(|p: u32| except.contains(&p)) {
            continue;
        }
        let counts: BTreeMap<String, u64> = serde_json::from_slice(&std::fs::read(&path)?)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        for (k, n) in counts {
            *out.entry(k).or_default() += n;
        }
    }
    Ok(out)
}

/// The counts so far, as `Service.Operation → calls`.
pub fn snapshot() -> BTreeMap<String, u64> {
    COUNTS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// What happened between two snapshots (operations with no new call left out).
pub fn since(before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    snapshot()
        .into_iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(&k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_counts_are_summed_over_processes_except_the_ones_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let write = |pid: u32, counts: &[(&str, u64)]| {
            let m: BTreeMap<&str, u64> = counts.iter().copied().collect();
            std::fs::write(
                dir.path().join(format!("{pid}.json")),
                serde_json::to_vec(&m).unwrap(),
            )
            .unwrap();
        };
        write(
            11,
            &[("SQS.SendMessage", 2), ("DynamoDB.GetItem [agent]", 1)],
        );
        write(12, &[("SQS.SendMessage", 3)]);
        std::fs::write(dir.path().join("13.tmp"), b"half written").unwrap();
        let all = sum_recorded(dir.path(), &[]).unwrap();
        assert_eq!(all["SQS.SendMessage"], 5);
        let some = sum_recorded(dir.path(), &[12]).unwrap();
        assert_eq!(some["SQS.SendMessage"], 2);
        std::fs::write(dir.path().join("14.json"), b"{not json").unwrap();
        let err = sum_recorded(dir.path(), &[]).unwrap_err().to_string();
        assert!(err.contains("14.json"), "{err}");
    }
}
