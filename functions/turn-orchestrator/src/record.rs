//! The turn record: load and save (versioned), its UI events (held in the record's outbox,
//! written with one call before the save) and the next step on the queue.

use crate::prelude::*;

pub(crate) fn now() -> u64 {
    harness_sdk::messages::now_ms()
}

/// The same context, its writes durable on commit (ends a step's deferral).
pub(crate) fn durably(ctx: &Ctx) -> Ctx {
    ctx.with_baggage(DURABILITY_BAGGAGE, "immediate")
}

/// Save at `version` (updated to the new one); a conflict means another delivery moved on.
/// The events held so far are written with it, in one write: a reader that sees the saved
/// record finds them. Durable at once when asked, or when it is the first save since a call
/// ran ([`Record::unsaved_call`]).
pub(crate) async fn save<P: RecordStore + ?Sized>(
    ports: &P,
    rec: &mut Record,
    version: &mut u64,
    durable: bool,
) -> StepResult<()> {
    save_holding(ports, rec, version, durable, HeldCall::DurableNow).await
}

/// [`save`] for a step that goes on into the run's next turn ([`crate::driver::Chain`]): the
/// record after the batch's last call is saved without waiting for the disk, and its sync
/// runs meanwhile, beside the next model call. The next call (and the step's end) waits for
/// it ([`settle`]), so a call still never runs before the result of the one before it is
/// durable; the model call it overlaps is redone anyway by a redelivery. A read is the
/// exception: it runs beside the save and settles it before its result is kept
/// ([`crate::states::calls::dispatch_with`]).
///
/// A store that saves in a task of its own ([`RecordStore::save_in_background`]) runs the
/// save itself beside the model call too ([`PendingSave`]): the next call and the next save
/// take its outcome first ([`settle_save`]), and the session's next events wait for it.
/// Until it is seen done, the record after the call is kept ([`Record::unsaved_call`]), so a
/// step that ends in an error saves that instead, as before.
pub(crate) async fn save_syncing_later<P: RecordStore + ?Sized>(
    ports: &P,
    rec: &mut Record,
    version: &mut u64,
) -> StepResult<()> {
    save_holding(ports, rec, version, false, HeldCall::SyncLater).await
}

/// The outcome of the save left running beside a model call, if any: the record's new
/// version, or the error that ends the step (a conflict: another delivery moved on).
pub(crate) async fn settle_save(rec: &mut Record, version: &mut u64) -> StepResult<()> {
    if let Some(saved) = rec.pending_save.take().await {
        *version = after_a_save(rec, saved)?;
        rec.unsaved_call = None;
    }
    Ok(())
}

/// A save's outcome, for the append it carried ([`crate::carried`]): the session's index as
/// it left it, for the next append. A save that failed wrote none of it: the history this
/// instance cached at its leaf is forgotten (another delivery may store other messages
/// under the same ids).
fn after_a_save(rec: &mut Record, saved: StepResult<u64>) -> StepResult<u64> {
    match saved {
        Ok(v) => {
            if let Some(index) = rec.carried.landed() {
                rec.tree_index = Some(index);
            }
            Ok(v)
        }
        Err(e) => {
            if matches!(rec.carried, Carried::Saving(_)) {
                rec.carried = Default::default();
                forget_history(&rec.session_id);
            }
            Err(e)
        }
    }
}

/// How a save that holds an executed call's record ([`Record::unsaved_call`]) makes it
/// durable.
enum HeldCall {
    /// The save itself is durable.
    DurableNow,
    /// The save is not; a sync started after it is ([`settle`]), or the save and its sync
    /// run in a task of their own where the store can ([`settle_save`]).
    SyncLater,
}

async fn save_holding<P: RecordStore + ?Sized>(
    ports: &P,
    rec: &mut Record,
    version: &mut u64,
    durable: bool,
    held: HeldCall,
) -> StepResult<()> {
    // After the save left running (this one is at its version), and the events after the
    // token deltas' last pushes.
    settle_save(rec, version).await?;
    rec.pending_push.settle().await;
    let mut events = std::mem::take(&mut rec.outbox);
    rec.updated_at_ms = now();
    let holds_call = rec.unsaved_call.is_some();
    if matches!(held, HeldCall::SyncLater)
        && let Some(saving) = ports.save_in_background(rec, *version, &mut events, holds_call)
    {
        rec.carried.handed_to_a_save();
        rec.pending_save.start(saving);
        return Ok(());
    }
    let durable = durable || (holds_call && matches!(held, HeldCall::DurableNow));
    let saved = ports.save(rec, *version, durable, events).await;
    rec.carried.handed_to_a_save();
    *version = after_a_save(rec, saved)?;
    if holds_call
        && matches!(held, HeldCall::SyncLater)
        && let Some(sync) = ports.start_sync()
    {
        rec.pending_sync.start(sync);
    }
    rec.unsaved_call = None;
    Ok(())
}

/// Wait for the sync started by [`save_syncing_later`], if any: before a call runs and before
/// the step ends. A store that cannot make the writes durable fails the step (the call is not
/// run; a redelivery finds the record as the store has it).
pub(crate) async fn settle(pending: &PendingSync) -> StepResult<()> {
    pending.settle().await.map_err(StepError::not_durable)
}

/// Before a call (or its hooks) runs: the save left running beside the model call is done
/// ([`settle_save`]) and the sync after the call before it too ([`settle`]), so no call runs
/// before the result of the one before it is durable.
pub(crate) async fn settle_before_a_call(rec: &mut Record, version: &mut u64) -> StepResult<()> {
    settle_save(rec, version).await?;
    settle(&rec.pending_sync).await
}

/// A step ends in an error after its batch's last call ran and before the save that was to
/// hold it: the record as it was after the call is saved now, durably (best effort: a store
/// that refuses it is the crash case, the call runs again).
pub(crate) async fn save_unsaved_call<P: RecordStore + ?Sized>(
    ports: &P,
    rec: &mut Record,
    version: &mut u64,
) {
    // A save left running that went through holds the call already.
    let _ = settle_save(rec, version).await;
    if let Some(mut after_call) = rec.unsaved_call.take()
        && let Err(e) = save(ports, &mut after_call, version, true).await
    {
        tracing::warn!(session = %rec.session_id, error = ?e, "the record after an executed call could not be saved");
    }
}

/// One UI event on `agent::events` (item `<sid>-<seq>`). Seq numbers come from the record, so
/// a redelivered step rewrites the same items instead of adding new ones. Held in the
/// record's outbox until the next flush.
pub(crate) fn emit(rec: &mut Record, event_type: &str, data: Value) {
    rec.event_seq += 1;
    emit_at(rec, rec.event_seq, event_type, data);
}

/// An event at a seq reserved earlier (saved with the record before the event is written).
pub(crate) fn emit_at(rec: &mut Record, seq: u64, event_type: &str, mut data: Value) {
    data["type"] = json!(event_type);
    let item = format!("{}-{:012}", rec.session_id, seq);
    let sid = rec.session_id.clone();
    rec.outbox.push((EVENTS.to_string(), sid, item, data));
}

/// A `turn_state_changed` event's data: the record's view (never the work list).
pub(crate) fn state_changed(rec: &Record, event_type: &str) -> Value {
    harness_sdk::fields([("event_type", event_type.into()), ("new_value", rec.view())])
}

/// Write the outbox's events in one call. A failure is logged, as a lost push would be: the
/// events are the UI's view, the record and the session tree are the truth.
pub(crate) async fn flush_events<E: EventStream + ?Sized>(events: &E, rec: &mut Record) {
    if rec.outbox.is_empty() {
        return;
    }
    after_what_is_running(rec).await;
    let items = std::mem::take(&mut rec.outbox);
    let count = items.len();
    if let Err(e) = events.store(items).await {
        tracing::warn!(error = %e, count, "events not stored");
    }
}

/// High-volume events are pushed, not stored.
pub(crate) async fn emit_transient<E: EventStream + ?Sized>(
    events: &E,
    rec: &Record,
    event_type: &str,
    data: Value,
) {
    after_what_is_running(rec).await;
    push_transient(events, &rec.session_id, event_type, data).await;
}

/// Once what the step left running that the session's events go after is done: the save
/// beside the model call (its events) and the token deltas' last pushes. A save waits for
/// the first's outcome instead ([`settle_save`]).
async fn after_what_is_running(rec: &Record) {
    rec.pending_save.done().await;
    rec.pending_push.settle().await;
}

/// [`emit_transient`] by session id, for a push that outlives the borrow of the record.
pub(crate) async fn push_transient<E: EventStream + ?Sized>(
    events: &E,
    session_id: &str,
    event_type: &str,
    data: Value,
) {
    events
        .push(session_id, event_type, typed(event_type, data))
        .await;
}

/// A pushed event's data carries its type, as a stored one does.
fn typed(event_type: &str, mut data: Value) -> Value {
    data["type"] = json!(event_type);
    data
}

/// [`push_transient`] of an event that supersedes the one before it of its type
/// ([`EventStream::push_latest`]).
pub(crate) async fn push_latest<E: EventStream + ?Sized>(
    events: &E,
    session_id: &str,
    event_type: &str,
    data: Value,
) {
    events
        .push_latest(session_id, event_type, typed(event_type, data))
        .await;
}

pub(crate) fn emit_turn_end(rec: &mut Record, results: Vec<AgentMessage>) {
    if rec.turn_end_emitted {
        return;
    }
    rec.turn_end_emitted = true;
    let data = json!({"message": rec.last_assistant, "function_results": results});
    emit(rec, "turn_end", data.clone());
    let item = format!("{}-{}", rec.session_id, rec.turn_count);
    let mut end = data;
    end["type"] = json!("turn_end");
    let sid = rec.session_id.clone();
    rec.outbox
        .push((TURN_END_STREAM.to_string(), sid, item, end));
}
