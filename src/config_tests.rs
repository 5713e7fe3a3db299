use super::*;

#[test]
fn both_presets_parse_and_thin_is_the_architectures_thin_harness() {
    let thin = Config::load("thin").unwrap();
    let embedded: Vec<_> = thin
        .workers
        .all()
        .into_iter()
        .filter(|(_, p, _)| p.embedded())
        .map(|(n, _, _)| n)
        .collect();
    assert_eq!(
        embedded,
        [
            "turn-orchestrator",
            "providers",
            "auth-credentials",
            "harness"
        ]
    );
    // Its policy stance is written in the file: no policy worker, every call denied.
    assert!(!thin.workers.policy.present());
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/presets/thin.yaml")).unwrap();
    assert!(text.contains("Policy stance"), "{text}");
    assert_eq!(thin.providers.names(), [ProviderName::Scripted]);
    let thick = Config::load("thick").unwrap();
    assert!(
        thick
            .workers
            .all()
            .iter()
            .filter(|(n, _, _)| *n != "slack-approval")
            .all(|(_, p, _)| p.embedded()),
        "thick embeds every worker but Slack's: {:?}",
        thick.workers
    );
    assert_eq!(thick.providers.names().len(), 6);
}

#[test]
fn errors_name_the_field_and_the_line() {
    let cases = [
        (
            "workers:\n  turn-orchestrator: embedded\n  polcy: embedded\n",
            &["polcy", "line 3"][..],
        ),
        (
            "workers:\n  turn-orchestrator: sometimes\n",
            &["workers.turn-orchestrator", "sometimes", "line 2"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\nrun:\n  max_turns: 0\n",
            &["run.max_turns", "line 4"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\nsandbox:\n  limits:\n    processes: -3\n",
            &["sandbox.limits.processes", "line 5"],
        ),
        (
            "workers:\n  turn-orchestrator: off\n",
            &["workers.turn-orchestrator at line 2", "nothing would run"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\n  providers: embedded\nproviders:\n  scripted: {}\nrun:\n  provider: kimi\n",
            &["run.provider at line 7", "kimi", "scripted"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\nproviders:\n  anthropic:\n    base_url: not a url\n",
            &["providers.anthropic.base_url", "line 5"],
        ),
        (
            "workers:\n  turn-orchestrator: embedded\nbudgets:\n  - budget_id: b\n    ceiling_usd: -1\n    period: day\n",
            &["budgets at line 3", "ceiling_usd"],
        ),
        ("workers: [1, 2]\n", &["workers", "line 1"]),
        ("{{{", &["line 1"]),
    ];
    for (text, needles) in cases {
        let err = Config::parse(text, "test.yaml").unwrap_err().to_string();
        assert!(err.starts_with("test.yaml: "), "{err}");
        for n in needles {
            assert!(err.contains(n), "`{n}` in the error for {text:?}: {err}");
        }
    }
}

#[test]
fn a_key_path_is_found_in_its_block_only() {
    let text = "a:\n  b: 1\nc:\n  # note\n  b: 2\n  d:\n    e: 3\n";
    assert_eq!(line_of(text, "c.b"), Some(5));
    assert_eq!(line_of(text, "a.b"), Some(2));
    assert_eq!(line_of(text, "c.d.e"), Some(7));
    assert_eq!(line_of(text, "a.d"), None);
}

#[test]
fn run_fallback_names_listed_providers_only() {
    let ok = THICK.replace(
        "  mode: agent\n",
        "  mode: agent\n  fallback:\n    - provider: openai\n      model: gpt-5.4-mini\n    - provider: bedrock\n",
    );
    let cfg = Config::parse(&ok, "h.yaml").unwrap();
    assert_eq!(cfg.run.fallback.len(), 2);
    assert_eq!(
        cfg.run.fallback[1].provider,
        ProviderChoice::Ours(ProviderName::Bedrock)
    );
    let unlisted = THIN.replace("run:\n", "run:\n  fallback:\n    - provider: openai\n");
    let e = Config::parse(&unlisted, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("run.fallback") && e.contains("openai"), "{e}");
}

#[test]
fn run_prompt_cache_is_on_unless_turned_off() {
    assert!(Config::parse(THICK, "h.yaml").unwrap().run.prompt_cache);
    assert!(Config::parse(THIN, "h.yaml").unwrap().run.prompt_cache);
    let off = THICK.replace("  prompt_cache: true", "  prompt_cache: false");
    assert!(!Config::parse(&off, "h.yaml").unwrap().run.prompt_cache);
    let junk = THICK.replace("  prompt_cache: true", "  prompt_cache: sometimes");
    let e = Config::parse(&junk, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("prompt_cache"), "{e}");
}

#[test]
fn a_worker_of_your_own_runs_remote_with_what_to_wait_for() {
    let with = |workers: &str| THICK.replace("workers:\n", &format!("workers:\n{workers}"));
    let cfg = Config::parse(
        &with(
            "  my-tools: {placement: remote, expect: [\"mytools::search\", \"mytools::fetch\"]}\n",
        ),
        "h.yaml",
    )
    .unwrap();
    let mine = &cfg.workers.custom["my-tools"];
    assert_eq!(mine.placement(), Placement::Remote);
    assert_eq!(mine.expect(), ["mytools::search", "mytools::fetch"]);
    // Ours still parse as ours.
    assert!(cfg.workers.custom.keys().all(|k| k == "my-tools"));
    // A misspelling of ours is refused, naming ours; so is one of yours with nothing to wait
    // for, one run embedded, and an expect that is not a function id.
    for (bad, says) in [
        ("  turn-orchestator: embedded\n", "not one of ours"),
        ("  my-tools: remote\n", "expect"),
        (
            "  my-tools: {placement: embedded, expect: [\"a::b\"]}\n",
            "only run remote",
        ),
        (
            "  my-tools: {placement: remote, expect: [\"nope\"]}\n",
            "not a function id",
        ),
        (
            "  \"my tools\": {placement: remote, expect: [\"a::b\"]}\n",
            "worker name",
        ),
    ] {
        let e = Config::parse(&with(bad), "h.yaml").unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    // Off is accepted (nothing runs, nothing is waited for).
    assert!(Config::parse(&with("  my-tools: off\n"), "h.yaml").is_ok());
}

#[test]
fn run_provider_may_be_a_provider_of_your_own() {
    let own = THICK.replace("  provider: auto\n", "  provider: acme\n  model: acme-1\n");
    let cfg = Config::parse(&own, "h.yaml").unwrap();
    assert_eq!(cfg.run.provider, ProviderChoice::Custom("acme".into()));
    let no_model = THICK.replace("  provider: auto\n", "  provider: acme\n");
    let e = Config::parse(&no_model, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("run.model"), "{e}");
    let bad = THICK.replace("  provider: auto\n", "  provider: \"Acme Inc\"\n");
    let e = Config::parse(&bad, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("provider::<name>::stream"), "{e}");
}

#[test]
fn doors_approval_wait_is_seconds_and_nothing_else() {
    assert_eq!(
        Config::parse(THICK, "h.yaml")
            .unwrap()
            .doors
            .approval_wait_secs,
        300
    );
    for junk in [
        "  approval_wait_secs: soon",
        "  approval_wait_secs: -5",
        "  approval_wait_secs: [1]",
    ] {
        let bad = THICK.replace("  approval_wait_secs: 300", junk);
        let e = Config::parse(&bad, "h.yaml").unwrap_err().to_string();
        assert!(e.contains("approval_wait_secs"), "{junk}: {e}");
    }
    let typo = THICK.replace("  approval_wait_secs: 300", "  approval_wait: 300");
    let e = Config::parse(&typo, "h.yaml").unwrap_err().to_string();
    assert!(e.contains("approval_wait"), "{e}");
}

#[test]
fn the_deployed_layout_is_read_and_checked_with_the_rest() {
    let shipped = Config::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/infra/harness.colocated.yaml"
    ))
    .unwrap();
    assert_eq!(
        shipped.lambda.colocate["core"][0], "turn-orchestrator",
        "{:?}",
        shipped.lambda
    );
    assert!(
        Config::parse(THICK, "h.yaml")
            .unwrap()
            .lambda
            .colocate
            .is_empty()
    );
    let grouped = format!("{THICK}\nlambda:\n  colocate:\n    core: [turn-orchestrator, tools]\n");
    let e = Config::parse(&grouped, "h.yaml").unwrap_err().to_string();
    assert!(
        e.starts_with("h.yaml: lambda.colocate.core: `tools` cannot share a Lambda"),
        "{e}"
    );
}
