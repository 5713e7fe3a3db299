//! A batch's results carried in the record's save: the session tree's index and entries go
//! in the record's transaction (`harness_sdk::session_layout`), so a tool call costs one
//! write where it cost two in a row (the session worker's append, then the record's save),
//! and the results and the record that says they exist are stored together or not at all.
//!
//! Only on an index the session worker answered with its layout, at the run's leaf. When the
//! transaction fails on the tree (another writer appended meanwhile, while the record is
//! still at the step's version), the session worker appends the same entries (same ids, same
//! parent) and the record is saved on its own, as before.

use crate::types::{CarriedAppend, StepError, StepResult};
use harness_sdk::Ctx;
use harness_sdk::contracts::{self, session_tree};
use serde_json::{Value, json};

impl CarriedAppend {
    /// The transaction wrote the entries: `versions` is its answer's, the record's first.
    pub fn wrote(&self, versions: &Value) {
        if let Some(version) = versions[1].as_u64() {
            let _ = self.landed.set(session_tree::IndexSeen {
                value: self.index.clone(),
                version,
                layout: Some(harness_sdk::session_layout::LAYOUT.into()),
            });
        }
    }

    /// The tree moved since the index was answered: the session worker appends the same
    /// entries. One it finds there already was written by another delivery of this step
    /// (the ids are the step's): this one is stale.
    pub async fn land_through_the_worker(&self, ctx: &Ctx) -> StepResult<()> {
        let out = ctx
            .trigger(session_tree::APPEND_BATCH, json!(self.fallback))
            .await?;
        let answer: session_tree::AppendBatchAnswer =
            contracts::parse(session_tree::APPEND_BATCH, out).map_err(|e| {
                StepError::Fatal(format!(
                    "the session store answered an unreadable append: {e}"
                ))
            })?;
        if answer.entries.len() != self.fallback.entries.len()
            || answer.entries.iter().any(|e| !e.created)
        {
            return Err(StepError::Stale);
        }
        if let Some(index) = answer.index {
            let _ = self.landed.set(index);
        }
        Ok(())
    }
}
