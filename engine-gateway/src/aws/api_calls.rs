//! Every AWS API call this process makes, counted by service and operation (one count per
//! operation, whatever its retries). An SDK interceptor on every client the backend builds;
//! the figures of `bench/results/aws.md` (calls per tool call) come from here.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
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

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let key = match cfg.load::<Metadata>() {
            Some(m) => format!("{}.{}", m.service(), m.name()),
            None => "unknown".to_string(),
        };
        let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(key).or_default() += 1;
        Ok(())
    }
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
