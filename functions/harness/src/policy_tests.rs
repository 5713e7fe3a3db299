use super::*;

const FILE: &str = r#"version: 1
rules:
  - "fs::read"
  - "!shell::exec"
  - rule_id: safe-write
    function: "fs::write"
    action: allow
    args:
      path: {matches: "^notes/.*\\.md$"}
  - function: "fs::*"
    action: deny
    args:
      path: {equals: "/etc/passwd"}
  - "web::*"
"#;

fn decide(p: &Policy, f: &str, args: Value) -> Decision {
    p.decide(f, &args)
}

#[test]
fn metadata_rules_read_what_the_function_registered() {
    let p = Policy::parse("iii-permissions.yaml", crate::SHIPPED_PERMISSIONS).unwrap();
    let ro = json!({"read_only": true});
    let allowed = p.decide_with("mcp::time::get_current_time", &json!({}), None, &ro);
    assert_eq!(
        allowed,
        Decision::Allow {
            rule_id: "mcp-read-only".into()
        }
    );
    assert!(p.reads_metadata("mcp::time::get_current_time"));
    assert!(!p.reads_metadata("fs::write"));
    // Not read-only, unknown metadata, or a non-MCP function claiming it: approval.
    for (f, m) in [
        ("mcp::time::set", json!({"read_only": false})),
        ("mcp::time::get_current_time", Value::Null),
        ("shell::exec", ro.clone()),
    ] {
        assert_eq!(
            p.decide_with(f, &json!({}), None, &m),
            Decision::NeedsApproval,
            "{f}"
        );
    }
    // A deny on a whole server goes first.
    let deny = Policy::parse(
        "p.yaml",
        &crate::SHIPPED_PERMISSIONS.replace("rules:\n", "rules:\n  - \"!mcp::everything::*\"\n"),
    )
    .unwrap();
    assert!(matches!(
        deny.decide_with("mcp::everything::echo", &json!({}), None, &ro),
        Decision::Deny { .. }
    ));
    // A rule's `name` and `read_only` of the wrong type are refused by name, at their line.
    for (bad, says) in [
        (
            "version: 1\nrules:\n  - {function: \"fs::*\", action: allow, name: 7}\n",
            "`name`",
        ),
        (
            "version: 1\nrules:\n  - {function: \"fs::*\", action: allow, name: \"\"}\n",
            "`name`",
        ),
        (
            "version: 1\nrules:\n  - {function: \"fs::*\", action: allow, read_only: \"yes\"}\n",
            "`read_only`",
        ),
        (
            "version: 1\nrules:\n  - {function: \"fs::*\", action: deny, read_only: true}\n",
            "allow rule",
        ),
    ] {
        let e = Policy::parse("p.yaml", bad).unwrap_err();
        assert!(e.message.contains(says), "{bad}: {e}");
        assert_eq!(e.line, 3);
    }
    for bad in [
        "version: 1\nrules:\n  - {function: \"mcp::*\", action: allow, metadata: [1]}\n",
        "version: 1\nrules:\n  - {function: \"mcp::*\", action: allow, metadata: {read_only: {is: true}}}\n",
    ] {
        let e = Policy::parse("p.yaml", bad).unwrap_err();
        assert!(
            e.message.contains("metadata") || e.message.contains("read_only"),
            "{e}"
        );
        assert_eq!(e.line, 3);
    }
}

#[test]
fn file_rules_first_match_wins_with_wildcards_and_constraints() {
    let p = Policy::parse("iii-permissions.yaml", FILE).unwrap();
    assert_eq!(
        decide(&p, "fs::read", json!({})),
        Decision::Allow {
            rule_id: "rule-1".into()
        }
    );
    assert_eq!(
        decide(&p, "shell::exec", json!({"command": "ls"})),
        Decision::Deny {
            rule_id: "rule-2".into(),
            matched_constraint: None
        }
    );
    assert_eq!(
        decide(&p, "fs::write", json!({"path": "notes/a.md"})),
        Decision::Allow {
            rule_id: "safe-write".into()
        }
    );
    // The constraint fails → the rule does not match → falls through to needs_approval.
    assert_eq!(
        decide(&p, "fs::write", json!({"path": "src/main.rs"})),
        Decision::NeedsApproval
    );
    assert_eq!(
        decide(&p, "fs::list", json!({"path": "/etc/passwd"})),
        Decision::Deny {
            rule_id: "rule-4".into(),
            matched_constraint: Some(json!({"path": {"equals": "/etc/passwd"}}))
        }
    );
    assert_eq!(
        decide(&p, "web::fetch", json!({})),
        Decision::Allow {
            rule_id: "rule-5".into()
        }
    );
    // Anchored: "web::*" does not match "myweb::x"; "fs::read" does not match "fs::reader".
    assert_eq!(decide(&p, "myweb::x", json!({})), Decision::NeedsApproval);
    assert_eq!(decide(&p, "fs::reader", json!({})), Decision::NeedsApproval);
}

#[test]
fn defaults_deny_internal_ids_even_if_the_file_allows_them() {
    let p = Policy::parse("f", "version: 1\nrules:\n  - \"*\"\n").unwrap();
    for id in [
        "approval::resolve",
        "policy::check_permissions",
        "state::set",
        "state::update",
        "state::delete",
        "state::transact",
        "stream::set_many",
        "run::start",
        "auth::set_token",
        "auth::delete_token",
        "engine::durable::publish",
        "hook-fanout::publish_collect",
    ] {
        assert!(
            matches!(decide(&p, id, json!({})), Decision::Deny { .. }),
            "{id}"
        );
    }
    assert!(matches!(
        decide(&p, "anything::else", json!({})),
        Decision::Allow { .. }
    ));
    let empty = Policy::default();
    // The agent's state reads stay inside its own session.
    let own = json!({"scope": "agent", "key": "session/s1/notes"});
    assert!(matches!(
        empty.decide_in("state::get", &own, Some("s1")),
        Decision::Allow { .. }
    ));
    assert!(matches!(
        empty.decide_in(
            "state::list",
            &json!({"scope": "agent", "prefix": "session/s1/"}),
            Some("s1")
        ),
        Decision::Allow { .. }
    ));
    for (args, session) in [
        (own.clone(), Some("s2")),
        (own.clone(), None),
        (
            json!({"scope": "approvals", "key": "session/s1/x"}),
            Some("s1"),
        ),
        (
            json!({"scope": "agent", "key": "session/s10/x"}),
            Some("s1"),
        ),
        (json!({"scope": "agent", "prefix": ""}), Some("s1")),
    ] {
        for id in ["state::get", "state::get_versioned", "state::list"] {
            assert!(
                matches!(empty.decide_in(id, &args, session), Decision::Deny { .. }),
                "{id} {args} in {session:?}"
            );
        }
    }
    // Each read, with `key`, `prefix` and both: judged by what the engine reads. A list
    // reads `prefix` (a `key` beside it once passed the check while the engine listed
    // the whole scope); a get reads `key`.
    for (id, args, allowed) in [
        (
            "state::get",
            json!({"scope": "agent", "key": "session/s1/a"}),
            true,
        ),
        (
            "state::get",
            json!({"scope": "agent", "prefix": "session/s1/"}),
            false,
        ),
        (
            "state::get",
            json!({"scope": "agent", "key": "session/s2/a", "prefix": "session/s1/"}),
            false,
        ),
        (
            "state::get",
            json!({"scope": "agent", "key": "session/s1/a", "prefix": "session/s2/"}),
            true,
        ),
        (
            "state::list",
            json!({"scope": "agent", "key": "session/s1/a"}),
            false,
        ),
        (
            "state::list",
            json!({"scope": "agent", "prefix": "session/s1/"}),
            true,
        ),
        (
            "state::list",
            json!({"scope": "agent", "key": "session/s1/a", "prefix": "session/"}),
            false,
        ),
        (
            "state::list",
            json!({"scope": "agent", "key": "session/s2/a", "prefix": "session/s1/"}),
            true,
        ),
        ("state::list", json!({"scope": "agent", "prefix": 7}), false),
    ] {
        let d = empty.decide_in(id, &args, Some("s1"));
        assert_eq!(
            matches!(d, Decision::Allow { .. }),
            allowed,
            "{id} {args}: {d:?}"
        );
    }
    assert!(matches!(
        decide(&p, "auth::get_token", json!({"provider": "anthropic"})),
        Decision::Deny { .. }
    ));
    for id in ["models::list", "directory::skills::get", "auth::status"] {
        assert!(
            matches!(decide(&empty, id, json!({})), Decision::Allow { .. }),
            "{id}"
        );
    }
    assert_eq!(
        decide(&empty, "fs::write", json!({})),
        Decision::NeedsApproval
    );
}

#[test]
fn an_allow_rule_may_grant_the_network() {
    let p = Policy::parse(
            "p.yaml",
            "version: 1\nrules:\n  - function: \"shell::exec\"\n    action: allow\n    network: true\n    args:\n      command: {matches: \"^curl \"}\n  - \"shell::exec\"\n",
        )
        .unwrap();
    assert!(p.network_granted("shell::exec", &json!({"command": "curl example.com"})));
    assert!(!p.network_granted("shell::exec", &json!({"command": "ls"})));
    let e = Policy::parse(
        "p.yaml",
        "version: 1\nrules:\n  - function: x\n    action: deny\n    network: true\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("allow rule"), "{e}");
    let e = Policy::parse(
        "p.yaml",
        "version: 1\nrules:\n  - function: x\n    action: allow\n    network: \"yes\"\n",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("`network` must be true or false"),
        "{e}"
    );
}

#[test]
fn errors_name_the_line() {
    let bad =
        "version: 1\nrules:\n  - \"fs::read\"\n  - function: \"fs::write\"\n    action: maybe\n";
    let e = Policy::parse("p.yaml", bad).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert!(
        e.to_string().contains("p.yaml: line 4") && e.to_string().contains("maybe"),
        "{e}"
    );
    let e = Policy::parse("p.yaml", "version: 1\nrules:\n  - \"a\"\n  - function: x\n    action: allow\n    args:\n      path: {matches: \"(\"}\n").unwrap_err();
    assert_eq!(e.line, 4);
    assert!(e.message.contains("regex"), "{e}");
    let e = Policy::parse("p.yaml", "version: 1\nrules: [\n").unwrap_err();
    assert!(e.message.contains("YAML"), "{e}");
    let e = Policy::parse("p.yaml", "version: 2\nrules: []\n").unwrap_err();
    assert_eq!(e.line, 1);
    let e = Policy::parse("p.yaml", "version: 1\nrules:\n  - \"fs read\"\n").unwrap_err();
    assert_eq!(e.line, 3);
    let e = Policy::parse(
        "p.yaml",
        "version: 1\nrules:\n  - function: a\n    action: allow\n    colour: red\n",
    )
    .unwrap_err();
    assert!(e.message.contains("colour"), "{e}");
}

#[test]
fn decisions_serialize_in_the_spec_shape() {
    assert_eq!(
        serde_json::to_value(Decision::Allow {
            rule_id: "r".into()
        })
        .unwrap(),
        json!({"decision": "allow", "rule_id": "r"})
    );
    assert_eq!(
        serde_json::to_value(Decision::NeedsApproval).unwrap(),
        json!({"decision": "needs_approval"})
    );
    assert_eq!(
        serde_json::to_value(Decision::Deny {
            rule_id: "r".into(),
            matched_constraint: Some(json!({"a": {"equals": 1}}))
        })
        .unwrap(),
        json!({"decision": "deny", "rule_id": "r", "matched_constraint": {"a": {"equals": 1}}})
    );
}
