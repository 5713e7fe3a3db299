//! Connections and the function registry: who is connected, under which credential, and
//! which worker owns each function ID (last registration wins, owner-safe clean-up).

use super::*;

impl Engine {
    /// A WebSocket connection arrived: give it a worker id.
    pub fn connect_remote(
        &self,
        outbox: Outbox,
        remote_addr: Option<String>,
        principal: Principal,
    ) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.publish_registry(RegistryOp::Put {
            kind: "connection",
            id: id.clone(),
            owner: id.clone(),
            body: json!({"remote_addr": remote_addr, "connected_at_ms": now_ms(), "role": principal.role.as_str(), "name": principal.name}),
        });
        write(&self.workers).insert(
            id.clone(),
            WorkerInfo {
                id: id.clone(),
                kind: WorkerKind::Remote,
                outbox: Some(outbox),
                remote_addr,
                connected_at_ms: now_ms(),
                name: None,
                metadata: Value::Null,
                principal,
            },
        );
        id
    }

    /// An in-process worker: its handlers are called directly.
    pub fn connect_embedded(&self, name: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        write(&self.workers).insert(
            id.clone(),
            WorkerInfo {
                id: id.clone(),
                kind: WorkerKind::Embedded,
                outbox: None,
                remote_addr: None,
                connected_at_ms: now_ms(),
                name: Some(name.to_string()),
                metadata: Value::Null,
                principal: Principal::admin(),
            },
        );
        id
    }

    /// `$disconnect`: drop what this worker still owns and fail its in-flight calls.
    pub fn disconnect(&self, worker_id: &str) {
        let was_remote = write(&self.workers)
            .remove(worker_id)
            .is_some_and(|w| w.kind == WorkerKind::Remote);
        if was_remote {
            self.publish_registry(RegistryOp::Remove {
                kind: "connection",
                id: worker_id.to_string(),
                owner: worker_id.to_string(),
            });
        }
        let owned: Vec<String> = read(&self.functions)
            .iter()
            .filter(|(_, f)| f.owner == worker_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in owned {
            self.publish_registry(RegistryOp::Remove {
                kind: "function",
                id,
                owner: worker_id.to_string(),
            });
        }
        let removed = {
            let mut functions = write(&self.functions);
            let before = functions.len();
            functions.retain(|_, f| f.owner != worker_id);
            functions.len() != before
        };
        if removed {
            self.catalogue_changed();
        }
        write(&self.triggers).retain(|_, t| t.owner != worker_id);
        write(&self.stream_subs).retain(|_, subs| {
            subs.remove(worker_id);
            !subs.is_empty()
        });
        let stopped: Vec<PendingCall> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<String> = pending
                .iter()
                .filter(|(_, p)| p.callee == worker_id)
                .map(|(k, _)| k.clone())
                .collect();
            ids.into_iter().filter_map(|k| pending.remove(&k)).collect()
        };
        for p in stopped {
            p.settle(self, Err(super::relay::callee_gone()));
        }
    }

    pub fn set_worker_info(&self, worker_id: &str, name: Option<String>, metadata: Value) -> bool {
        // Whether the name reaches the catalogue: a skill's id names its worker, but only a
        // worker with functions has skills. A connection that registers nothing (an event
        // stream, a door following a turn) is named without making every run's cached tool
        // list and skills index stale.
        let owns_functions = read(&self.functions).values().any(|f| f.owner == worker_id);
        match write(&self.workers).get_mut(worker_id) {
            Some(w) => {
                if name.is_some() && name != w.name {
                    w.name = name;
                    if owns_functions {
                        self.catalogue_changed();
                    }
                }
                if !metadata.is_null() {
                    w.metadata = metadata;
                }
                true
            }
            None => false,
        }
    }

    /// Who a connection authenticated as (`None`: not connected).
    pub fn principal(&self, worker_id: &str) -> Option<Principal> {
        read(&self.workers)
            .get(worker_id)
            .map(|w| w.principal.clone())
    }

    /// Whether `function_id` is registered with `metadata.public = true`.
    pub fn is_public(&self, function_id: &str) -> bool {
        read(&self.functions)
            .get(function_id)
            .is_some_and(|f| crate::access::is_public(f.def.metadata.as_ref()))
    }

    /// The connection's principal, or `forbidden` for an unknown one.
    pub(super) fn principal_of(&self, worker_id: &str) -> Result<Principal, ErrorBody> {
        self.principal(worker_id)
            .ok_or_else(|| ErrorBody::new(codes::FORBIDDEN, "unknown connection"))
    }

    /// Push a frame to a connection (the `@connections` model). `false` = gone.
    pub fn push(&self, worker_id: &str, msg: &Message) -> bool {
        let outbox = read(&self.workers)
            .get(worker_id)
            .and_then(|w| w.outbox.clone());
        match outbox {
            Some(o) => o.send(Outbound::Text(msg.to_json())).is_ok(),
            None => false,
        }
    }

    // ---------------------------------------------------------------- functions

    pub(super) fn validate_function_id(id: &str) -> Result<(), ErrorBody> {
        if id.trim().is_empty() {
            return Err(ErrorBody::invalid("function `id` must not be empty"));
        }
        if id.len() > 256 {
            return Err(ErrorBody::invalid(
                "function `id` is longer than 256 characters",
            ));
        }
        Ok(())
    }

    /// What only the engine may register: its namespaces, and any ID a built-in serves.
    pub(super) fn check_registrable(&self, owner: &str, id: &str) -> Result<(), ErrorBody> {
        if owner == ENGINE_OWNER {
            return Ok(());
        }
        crate::protocol::check_not_reserved(id)?;
        if read(&self.functions)
            .get(id)
            .is_some_and(|f| f.owner == ENGINE_OWNER)
        {
            return Err(ErrorBody::new(
                codes::FORBIDDEN,
                format!("`{id}` is an engine built-in and cannot be replaced"),
            ));
        }
        Ok(())
    }

    /// Register a function served by a remote connection (last registration wins).
    pub fn register_remote(&self, worker_id: &str, def: RegisterFunction) -> Result<(), ErrorBody> {
        Self::validate_function_id(&def.id)?;
        self.check_registrable(worker_id, &def.id)?;
        self.principal_of(worker_id)?
            .may_register("function", &def.id)?;
        let outbox = read(&self.workers)
            .get(worker_id)
            .and_then(|w| w.outbox.clone())
            .ok_or_else(|| ErrorBody::invalid("unknown connection"))?;
        self.insert_function(worker_id, def, Target::Remote(outbox));
        Ok(())
    }

    /// Register an in-process handler (embedded workers and engine built-ins).
    pub fn register_local(
        &self,
        owner: &str,
        def: RegisterFunction,
        handler: Handler,
    ) -> Result<(), ErrorBody> {
        self.register_in_process(owner, def, handler, false)
    }

    /// [`Self::register_local`], saying whether the handler reads [`Invocation::attachment`]
    /// itself (`attachments`: an in-process caller's attachment then reaches it unserialized;
    /// otherwise it is written into the payload first).
    pub fn register_in_process(
        &self,
        owner: &str,
        def: RegisterFunction,
        handler: Handler,
        attachments: bool,
    ) -> Result<(), ErrorBody> {
        Self::validate_function_id(&def.id)?;
        self.check_registrable(owner, &def.id)?;
        self.insert_function(
            owner,
            def,
            Target::Local {
                handler,
                attachments,
            },
        );
        Ok(())
    }

    pub(super) fn insert_function(&self, owner: &str, def: RegisterFunction, target: Target) {
        let id = def.id.clone();
        if owner != ENGINE_OWNER {
            let kind = match &target {
                Target::Local { .. } => "local",
                Target::Remote(_) => "connection",
            };
            self.publish_registry(RegistryOp::Put {
                kind: "function",
                id: id.clone(),
                owner: owner.to_string(),
                body: json!({"target": kind, "worker_id": owner, "description": def.description}),
            });
        }
        write(&self.functions).insert(
            id,
            FunctionEntry {
                def,
                owner: owner.to_string(),
                target,
                registered_at_ms: now_ms(),
            },
        );
        self.catalogue_changed();
    }

    /// Remove a registration only if `owner` still owns it.
    pub fn unregister_function(&self, owner: &str, id: &str) -> bool {
        let mut f = write(&self.functions);
        if f.get(id).is_some_and(|e| e.owner == owner) {
            f.remove(id);
            self.catalogue_changed();
            self.publish_registry(RegistryOp::Remove {
                kind: "function",
                id: id.to_string(),
                owner: owner.to_string(),
            });
            true
        } else {
            false
        }
    }

    pub fn has_function(&self, id: &str) -> bool {
        read(&self.functions).contains_key(id)
    }

    pub fn list_functions(&self) -> Value {
        json!({ "functions": self.function_entries(true) })
    }

    fn catalogue_changed(&self) {
        self.catalogue_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Names this engine's catalogue as it is now: it changes whenever a function is
    /// registered or removed or a worker is named, and differs between engine runs. A worker
    /// that derives something from the catalogue (the directory's skills, a run's tool list)
    /// keeps it while this is the same, instead of reading the whole catalogue again. Read it
    /// before the catalogue, so a change in between only makes the derived thing look stale.
    pub fn catalogue_version(&self) -> String {
        format!(
            "{}-{}",
            self.boot_id,
            self.catalogue_generation.load(Ordering::SeqCst)
        )
    }

    /// Every function by id; `formats`: with the schemas (a run's tool catalogue needs none,
    /// and copying them for every run start cost a tenth of 50 concurrent sessions' turns).
    pub fn function_entries(&self, formats: bool) -> Vec<Value> {
        self.function_entries_from(formats, None, None, usize::MAX)
    }

    /// [`Self::function_entries`] of the ids after `after` that start with `prefix`, at most
    /// `limit` of them: only those are built (a page of one costs one entry, not the catalogue).
    pub fn function_entries_from(
        &self,
        formats: bool,
        prefix: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<Value> {
        let functions = read(&self.functions);
        let mut ids: Vec<&String> = functions
            .keys()
            .filter(|id| {
                prefix.is_none_or(|p| id.starts_with(p)) && after.is_none_or(|a| id.as_str() > a)
            })
            .collect();
        ids.sort_unstable();
        ids.truncate(limit);
        ids.into_iter()
            .map(|id| {
                let f = &functions[id];
                let mut entry = json!({
                    "function_id": f.def.id,
                    "description": f.def.description,
                    "metadata": f.def.metadata,
                    "worker_id": f.owner,
                    "registered_at_ms": f.registered_at_ms,
                });
                if formats {
                    entry["request_format"] = json!(f.def.request_format);
                    entry["response_format"] = json!(f.def.response_format);
                }
                entry
            })
            .collect()
    }

    pub fn list_workers(&self) -> Value {
        let functions = read(&self.functions);
        let mut out: Vec<Value> = read(&self.workers)
            .values()
            .map(|w| {
                let mut fns: Vec<&str> = functions
                    .values()
                    .filter(|f| f.owner == w.id)
                    .map(|f| f.def.id.as_str())
                    .collect();
                fns.sort_unstable();
                json!({
                    "worker_id": w.id,
                    "kind": match w.kind { WorkerKind::Remote => "remote", WorkerKind::Embedded => "embedded", WorkerKind::Lambda => "lambda" },
                    "name": w.name,
                    "metadata": w.metadata,
                    "remote_addr": w.remote_addr,
                    "connected_at_ms": w.connected_at_ms,
                    "functions": fns,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            a["connected_at_ms"]
                .as_u64()
                .cmp(&b["connected_at_ms"].as_u64())
        });
        json!({ "workers": out })
    }

    // ---------------------------------------------------------------- invocations
}
