//! llm-budget (SPEC §3): 14 `budget::*` functions over records in scope `budgets`.
//!
//! Every write is a versioned read-modify-write (`Ctx::state_transact`), so records from
//! many processes sum exactly (conditional writes on DynamoDB). Windows are UTC (weeks start
//! Monday); rollover is lazy: any read or write that finds the window over closes it, keeps
//! it in the record's recent list and archives it at `budget-windows/<id>/<start_ms>`. An
//! alert is marked fired in the same write that crosses its threshold, so it fires once per
//! window however many writers race.

pub mod budget;
pub mod period;
pub mod types;

use budget::*;
use bus::builtins::req_str;
use harness_sdk::{BusError, Ctx, DefExt, ErrorBody, Worker, Write, def};
use period::Period;
use serde_json::{Value, json};

pub const SCOPE: &str = "budgets";
pub const ARCHIVE: &str = "budget-windows";
const CALLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn now() -> u64 {
    harness_sdk::messages::now_ms()
}

fn storage(e: BusError) -> ErrorBody {
    ErrorBody::new("storage", format!("budget storage failed: {e}"))
}

fn not_found(id: &str) -> ErrorBody {
    ErrorBody::new("not_found", format!("budget `{id}` does not exist"))
}

fn budget_id(data: &Value) -> Result<String, ErrorBody> {
    let id = req_str(data, "budget_id")?;
    if id.is_empty() || id.contains('/') {
        return Err(ErrorBody::invalid(
            "`budget_id` must be non-empty without `/`",
        ));
    }
    Ok(id)
}

fn positive_usd(v: &Value, field: &str) -> Result<f64, ErrorBody> {
    match v.as_f64() {
        Some(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(ErrorBody::invalid(format!(
            "`{field}` must be a number > 0"
        ))),
    }
}

/// Run `f` on the budget after lazy rollover, and write when `f` changed it (`write`) or a
/// window closed → (budget after, f's output).
async fn with_budget<T, F>(
    ctx: &Ctx,
    id: &str,
    write: bool,
    mut f: F,
) -> Result<(Budget, T), ErrorBody>
where
    F: FnMut(&mut Budget) -> Result<T, ErrorBody>,
{
    let t = now();
    let mut closed_out: Option<Window> = None;
    let result = ctx
        .state_transact(SCOPE, id, |current| {
            let Some(current) = current else {
                return Ok((Write::Keep, Err(not_found(id))));
            };
            let mut b: Budget = match serde_json::from_value(current) {
                Ok(b) => b,
                Err(e) => {
                    return Ok((
                        Write::Keep,
                        Err(ErrorBody::new(
                            "storage",
                            format!("unreadable budget `{id}`: {e}"),
                        )),
                    ));
                }
            };
            let closed = b.rollover(t);
            let out = match f(&mut b) {
                Ok(out) => out,
                Err(e) => return Ok((Write::Keep, Err(e))),
            };
            closed_out = closed.clone();
            let w = if write || closed.is_some() {
                Write::Put(serde_json::to_value(&b).unwrap_or(Value::Null))
            } else {
                Write::Keep
            };
            Ok((w, Ok((b, out))))
        })
        .await
        .map_err(storage)??;
    if let Some(w) = closed_out {
        // Archived after the commit; the record's recent list holds it meanwhile.
        let key = format!("{id}/{:013}", w.start_ms);
        if let Err(e) = ctx
            .state_set(
                ARCHIVE,
                &key,
                serde_json::to_value(&w).unwrap_or(Value::Null),
            )
            .await
        {
            tracing::warn!(budget = id, error = %e, "closed window not archived");
        }
    }
    Ok(result)
}

async fn fire(ctx: &Ctx, b: &Budget, alerts: Vec<Alert>) {
    for a in alerts {
        let payload = json!({
            "budget_id": b.budget_id,
            "alert_id": a.alert_id,
            "threshold_pct": a.threshold_pct,
            "spent_usd": to_usd(b.window.spent_nanos),
            "ceiling_usd": to_usd(b.ceiling_nanos),
            "window_start_ms": b.window.start_ms,
            "payload": a.callback_payload,
        });
        if let Err(e) = ctx
            .trigger_timeout(&a.callback_function_id, payload, CALLBACK_TIMEOUT)
            .await
        {
            tracing::warn!(budget = %b.budget_id, callback = %a.callback_function_id, error = %e, "budget alert callback failed");
        }
    }
}

// ------------------------------------------------------------------ the 14 functions

async fn create(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let ceiling = positive_usd(&data["ceiling_usd"], "ceiling_usd")?;
    let period_s = req_str(&data, "period")?;
    let period = Period::parse(&period_s).ok_or_else(|| {
        ErrorBody::invalid(format!(
            "`period` must be day, week or month, not `{period_s}`"
        ))
    })?;
    let id = match data["budget_id"].as_str() {
        Some(id) => budget_id(&json!({"budget_id": id}))?,
        None => format!("bud-{}", bus_telemetry::trace::random_hex(6)),
    };
    let t = now();
    let b = Budget {
        budget_id: id.clone(),
        name: data["name"].as_str().map(str::to_owned),
        workspace_id: data["workspace_id"].as_str().map(str::to_owned),
        agent_id: data["agent_id"].as_str().map(str::to_owned),
        ceiling_nanos: to_nanos(ceiling),
        period,
        enforced: true,
        paused: false,
        created_at_ms: t,
        window: Window::new(period, t),
        recent_windows: Vec::new(),
        alerts: Vec::new(),
        exemptions: Default::default(),
    };
    match ctx
        .state_set_if(
            SCOPE,
            &id,
            serde_json::to_value(&b).unwrap_or(Value::Null),
            0,
        )
        .await
    {
        Ok(_) => Ok(json!({"budget_id": id, "budget": b.view()})),
        Err(BusError::VersionConflict(_)) => Err(ErrorBody::new(
            "already_exists",
            format!("budget `{id}` already exists"),
        )),
        Err(e) => Err(storage(e)),
    }
}

async fn list(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let v = ctx.state_list(SCOPE, None).await.map_err(storage)?;
    let ws = data["workspace_id"].as_str();
    let ag = data["agent_id"].as_str();
    let t = now();
    let mut out = Vec::new();
    for item in v["items"].as_array().into_iter().flatten() {
        let Ok(mut b) = serde_json::from_value::<Budget>(item["value"].clone()) else {
            continue;
        };
        if (ws.is_some() || ag.is_some()) && !b.applies_to(ws, ag) {
            continue;
        }
        b.rollover(t); // the view is current; the stored record rolls over on its next use
        out.push(b.view());
    }
    Ok(json!({"budgets": out}))
}

async fn get(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let (b, _) = with_budget(&ctx, &id, false, |_| Ok(())).await?;
    Ok(b.view())
}

async fn update(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let patch = data["patch"]
        .as_object()
        .cloned()
        .ok_or_else(|| ErrorBody::invalid("`patch` must be an object"))?;
    let t = now();
    let (b, _) = with_budget(&ctx, &id, true, |b| {
        for (k, v) in &patch {
            match k.as_str() {
                "name" => b.name = v.as_str().map(str::to_owned),
                "workspace_id" => b.workspace_id = v.as_str().map(str::to_owned),
                "agent_id" => b.agent_id = v.as_str().map(str::to_owned),
                "ceiling_usd" => b.ceiling_nanos = to_nanos(positive_usd(v, "patch.ceiling_usd")?),
                "enforced" => b.enforced = v.as_bool().ok_or_else(|| ErrorBody::invalid("`patch.enforced` must be a boolean"))?,
                "paused" => b.paused = v.as_bool().ok_or_else(|| ErrorBody::invalid("`patch.paused` must be a boolean"))?,
                "period" => {
                    let p = v.as_str().and_then(Period::parse).ok_or_else(|| ErrorBody::invalid("`patch.period` must be day, week or month"))?;
                    if p != b.period {
                        // The current spend carries into the new window.
                        let spent = b.window.spent_nanos;
                        let records = b.window.records;
                        b.period = p;
                        b.window = Window::new(p, t);
                        b.window.spent_nanos = spent;
                        b.window.records = records;
                    }
                }
                other => return Err(ErrorBody::invalid(format!("`patch.{other}` is not an updatable field (name, workspace_id, agent_id, ceiling_usd, period, enforced, paused)"))),
            }
        }
        Ok(())
    })
    .await?;
    Ok(b.view())
}

async fn delete(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let out = ctx.state_delete(SCOPE, &id).await.map_err(storage)?;
    Ok(json!({"budget_id": id, "deleted": out["deleted"]}))
}

async fn check(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let estimated = match data.get("estimated_cost_usd") {
        None | Some(Value::Null) => 0,
        Some(v) => to_nanos(
            v.as_f64()
                .filter(|x| *x >= 0.0)
                .ok_or_else(|| ErrorBody::invalid("`estimated_cost_usd` must be a number >= 0"))?,
        ),
    };
    let principal = data["principal_id"].as_str().map(str::to_owned);
    let t = now();
    let (b, outcome) = with_budget(&ctx, &id, false, |b| {
        Ok(b.check(estimated, principal.as_deref(), t))
    })
    .await?;
    let mut out = json!({"budget_id": id, "allowed": outcome.allowed, "remaining_usd": to_usd(outcome.remaining_nanos), "spent_usd": to_usd(b.window.spent_nanos), "ceiling_usd": to_usd(b.ceiling_nanos)});
    if let Some(r) = outcome.reason {
        out["reason"] = json!(r);
    }
    Ok(out)
}

async fn record(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let cost = data["cost_usd"]
        .as_f64()
        .filter(|x| *x >= 0.0 && x.is_finite())
        .ok_or_else(|| ErrorBody::invalid("`cost_usd` must be a number >= 0"))?;
    let nanos = to_nanos(cost);
    let (b, fired) = with_budget(&ctx, &id, true, |b| Ok(b.record(nanos))).await?;
    let alerts: Vec<String> = fired.iter().map(|a| a.alert_id.clone()).collect();
    fire(&ctx, &b, fired).await;
    Ok(
        json!({"budget_id": id, "spent_usd": to_usd(b.window.spent_nanos), "remaining_usd": to_usd(b.remaining_nanos()), "alerts_fired": alerts}),
    )
}

async fn reset(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let (b, _) = with_budget(&ctx, &id, true, |b| {
        b.window.spent_nanos = 0;
        b.window.records = 0;
        for a in &mut b.alerts {
            a.fired_window_start = None;
        }
        Ok(())
    })
    .await?;
    Ok(b.view())
}

async fn alert_set(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let pct = data["threshold_pct"]
        .as_f64()
        .filter(|p| *p > 0.0 && *p <= 1.0)
        .ok_or_else(|| ErrorBody::invalid("`threshold_pct` must be in (0, 1]"))?;
    let callback = req_str(&data, "callback_function_id")?;
    let payload = data.get("callback_payload").cloned().unwrap_or(Value::Null);
    let (_, alert_id) = with_budget(&ctx, &id, true, |b| {
        // One alert per threshold: setting it again replaces the callback, keeps fired state.
        if let Some(a) = b
            .alerts
            .iter_mut()
            .find(|a| (a.threshold_pct - pct).abs() < 1e-9)
        {
            a.callback_function_id = callback.clone();
            a.callback_payload = payload.clone();
            return Ok(a.alert_id.clone());
        }
        let alert_id = format!("alert-{}", (pct * 100.0).round() as u64);
        b.alerts.push(Alert {
            alert_id: alert_id.clone(),
            threshold_pct: pct,
            callback_function_id: callback.clone(),
            callback_payload: payload.clone(),
            fired_window_start: None,
        });
        Ok(alert_id)
    })
    .await?;
    Ok(json!({"budget_id": id, "alert_id": alert_id}))
}

async fn usage(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let (b, _) = with_budget(&ctx, &id, false, |_| Ok(())).await?;
    let archived = ctx
        .state_list(ARCHIVE, Some(&format!("{id}/")))
        .await
        .map_err(storage)?;
    let mut windows: Vec<Window> = archived["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| serde_json::from_value(i["value"].clone()).ok())
        .collect();
    for w in &b.recent_windows {
        if !windows.iter().any(|x| x.start_ms == w.start_ms) {
            windows.push(w.clone());
        }
    }
    windows.sort_by_key(|w| w.start_ms);
    let history: Vec<Value> = windows.iter().map(Window::view).collect();
    let selected = match data["window"].as_str() {
        None | Some("current") => b.window.view(),
        Some("previous") => windows.last().map(Window::view).unwrap_or(Value::Null),
        Some(other) => {
            return Err(ErrorBody::invalid(format!(
                "`window` must be current or previous, not `{other}`"
            )));
        }
    };
    Ok(
        json!({"budget_id": id, "period": b.period, "window": selected, "current": b.window.view(), "history": history}),
    )
}

async fn forecast(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let t = now();
    let (b, _) = with_budget(&ctx, &id, false, |_| Ok(())).await?;
    Ok(b.forecast(t))
}

async fn enforce(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let on = data["enforced"]
        .as_bool()
        .ok_or_else(|| ErrorBody::invalid("`enforced` must be a boolean"))?;
    let (b, _) = with_budget(&ctx, &id, true, |b| {
        b.enforced = on;
        Ok(())
    })
    .await?;
    Ok(json!({"budget_id": id, "enforced": b.enforced}))
}

async fn exempt(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let principal = req_str(&data, "principal_id")?;
    let reason = req_str(&data, "reason")?;
    let until = now() + EXEMPTION_MS;
    with_budget(&ctx, &id, true, |b| {
        b.exemptions.insert(
            principal.clone(),
            Exemption {
                reason: reason.clone(),
                until_ms: until,
            },
        );
        Ok(())
    })
    .await?;
    Ok(json!({"budget_id": id, "principal_id": principal, "until_ms": until}))
}

async fn pause(ctx: Ctx, data: Value) -> Result<Value, ErrorBody> {
    let id = budget_id(&data)?;
    let paused = data["paused"]
        .as_bool()
        .ok_or_else(|| ErrorBody::invalid("`paused` must be a boolean"))?;
    let (b, _) = with_budget(&ctx, &id, true, |b| {
        b.paused = paused;
        Ok(())
    })
    .await?;
    Ok(json!({"budget_id": id, "paused": b.paused}))
}

pub fn worker() -> Worker {
    let errs: &[(&str, &str)] = &[
        ("not_found", "no budget with that id"),
        (
            "invalid_message",
            "a field is missing or out of range; the message names it",
        ),
        ("storage", "the state store failed; safe to retry"),
    ];
    let mut w = Worker::new("llm-budget");
    w.register_function(
        def(
            "budget::create",
            "Create a spend ceiling for a UTC day, week (from Monday) or month.",
        )
        .not_for_the_agent()
        .contract::<types::CreateRequest, types::CreateAnswer>()
        .errors(errs),
        create,
    );
    w.register_function(
        def(
            "budget::list",
            "Budgets; with workspace_id/agent_id, only those that govern such a run.",
        )
        .contract::<types::ListRequest, types::ListAnswer>()
        .errors(errs),
        list,
    );
    w.register_function(
        def("budget::get", "One budget with its current window.")
            .contract::<types::BudgetRef, types::BudgetView>()
            .errors(errs),
        get,
    );
    w.register_function(
        def(
            "budget::update",
            "Change name, scope, ceiling_usd, period, enforced or paused.",
        )
        .not_for_the_agent()
        .contract::<types::UpdateRequest, types::BudgetView>()
        .errors(errs),
        update,
    );
    w.register_function(
        def("budget::delete", "Delete a budget.")
            .not_for_the_agent()
            .contract::<types::BudgetRef, types::DeleteAnswer>()
            .errors(errs),
        delete,
    );
    w.register_function(
        def(
            "budget::check",
            "May this principal spend (estimated_cost_usd more)?",
        )
        .contract::<types::CheckRequest, types::CheckAnswer>()
        .errors(errs),
        check,
    );
    w.register_function(
        def(
            "budget::record",
            "Add spend; fires threshold alerts once per period.",
        )
        .not_for_the_agent()
        .contract::<types::RecordRequest, types::RecordAnswer>()
        .errors(errs),
        record,
    );
    w.register_function(
        def(
            "budget::reset",
            "Zero the current window's spend and re-arm its alerts.",
        )
        .not_for_the_agent()
        .contract::<types::BudgetRef, types::BudgetView>()
        .errors(errs),
        reset,
    );
    w.register_function(def("budget::alert_set", "Call callback_function_id once per period when spend reaches threshold_pct of the ceiling.")
        .not_for_the_agent().contract::<types::AlertRequest, types::AlertAnswer>().errors(errs), alert_set);
    w.register_function(
        def(
            "budget::usage",
            "The current (or previous) window and every archived one.",
        )
        .contract::<types::UsageRequest, types::UsageAnswer>()
        .errors(errs),
        usage,
    );
    w.register_function(
        def(
            "budget::forecast",
            "Spend extrapolated from this window's rate.",
        )
        .contract::<types::BudgetRef, types::ForecastAnswer>()
        .errors(errs),
        forecast,
    );
    w.register_function(
        def(
            "budget::enforce",
            "Turn enforcement on or off (off: check always allows, reason not_enforced).",
        )
        .not_for_the_agent()
        .contract::<types::EnforceRequest, types::EnforceAnswer>()
        .errors(errs),
        enforce,
    );
    w.register_function(
        def("budget::exempt", "Exempt a principal for 24 hours.")
            .not_for_the_agent()
            .contract::<types::ExemptRequest, types::ExemptAnswer>()
            .errors(errs),
        exempt,
    );
    w.register_function(
        def(
            "budget::pause",
            "Pause (check denies everything, reason paused) or resume.",
        )
        .not_for_the_agent()
        .contract::<types::PauseRequest, types::PauseAnswer>()
        .errors(errs),
        pause,
    );
    w
}
