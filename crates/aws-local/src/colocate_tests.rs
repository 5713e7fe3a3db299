use super::*;
use crate::deployed::template_functions;

fn shipped() -> Value {
    serde_norway::from_str(include_str!("../../../infra/template.yaml")).unwrap()
}

fn layout(yaml: &str) -> Result<LambdaLayout, ColocateError> {
    LambdaLayout::from_config(yaml, "harness.yaml")
}

const CORE: &str = "workers: {turn-orchestrator: lambda}\nlambda:\n  colocate:\n    core: [turn-orchestrator, policy, session, hook-fanout]\n    catalogue: [auth-credentials, llm-budget, models-catalog]\n";

#[test]
fn a_group_becomes_one_function_with_its_members_settings() {
    let t = colocate(&shipped(), &layout(CORE).unwrap()).unwrap();
    let r = t["Resources"].as_object().unwrap();
    for gone in [
        "TurnOrchestratorFunction",
        "TurnOrchestratorLogs",
        "HarnessFunction",
        "HarnessLogs",
        "SessionFunction",
        "LlmBudgetFunction",
        "AuthCredentialsFunction",
        "ModelsCatalogFunction",
    ] {
        assert!(!r.contains_key(gone), "{gone}");
    }
    // Nothing else refers to a member any more.
    let text = serde_json::to_string(&t).unwrap();
    assert!(!text.contains("TurnOrchestratorFunction"), "{text}");
    for kept in [
        "ToolsFunction",
        "ProviderAnthropicFunction",
        "ApprovalGateFunction",
        "EngineRouterFunction",
    ] {
        assert!(r.contains_key(kept), "{kept}");
    }
    assert_eq!(
        r["ColocatedCoreLogs"]["Properties"],
        json!({"LogGroupName": {"Fn::Sub": "/aws/lambda/${Prefix}core"}, "RetentionInDays": {"Ref": "LogRetentionDays"}})
    );
    let core = &r["ColocatedCoreFunction"];
    assert_eq!(core["Metadata"]["BuildProperties"]["Binary"], BINARY);
    let p = &core["Properties"];
    assert_eq!(p["MemorySize"], 512, "the orchestrator's, the largest");
    assert_eq!(p["Timeout"], 330);
    assert!(
        p["Events"]["TurnSteps"]["Properties"]["Queue"].is_object(),
        "the step queue feeds it"
    );
    let env = &p["Environment"]["Variables"];
    assert_eq!(
        env["HARNESS_COLOCATED_WORKERS"],
        "turn-orchestrator,harness-worker,session,hook-fanout"
    );
    assert_eq!(env["HARNESS_PERMISSIONS_SECRET"], "harness/permissions");
    assert!(env["WS_MANAGEMENT_ENDPOINT"].is_object());
    let policies = p["Policies"].as_array().unwrap();
    assert!(
        policies
            .iter()
            .any(|p| p.get("SQSSendMessagePolicy").is_some())
    );
    let reads_secrets = |policies: &[Value]| {
        policies
            .iter()
            .filter(|p| p.to_string().contains("secretsmanager:GetSecretValue"))
            .count()
    };
    assert!(reads_secrets(policies) >= 1, "the harness's: {policies:?}");
    // The providers' callbacks go to the other group, with the credentials' secrets.
    let catalogue = &r["ColocatedCatalogueFunction"]["Properties"];
    assert_eq!(
        catalogue["Environment"]["Variables"]["HARNESS_COLOCATED_WORKERS"],
        "auth-credentials,llm-budget,models-catalog"
    );
    assert!(reads_secrets(catalogue["Policies"].as_array().unwrap()) >= 1);
    // Identical statements are kept once.
    let unique: std::collections::HashSet<String> = policies.iter().map(Value::to_string).collect();
    assert_eq!(unique.len(), policies.len());

    // The local deployed shape reads it as AWS would.
    let fs = template_functions(&t, "dx-", "local", &[], &[]).unwrap();
    let core = fs
        .iter()
        .find(|f| f.resource == "ColocatedCoreFunction")
        .unwrap();
    assert_eq!(core.name, "dx-core");
    assert_eq!(core.binary, BINARY);
    assert_eq!(core.queue.as_ref().unwrap().queue, "turn-steps");
    assert_eq!(
        fs.len(),
        template_functions(&shipped(), "dx-", "local", &[], &[])
            .unwrap()
            .len()
            - 5
    );
}

#[test]
fn no_layout_leaves_the_template_as_it_is() {
    assert_eq!(
        colocate(&shipped(), &LambdaLayout::default()).unwrap(),
        shipped()
    );
    assert_eq!(layout("workers: {}\n").unwrap(), LambdaLayout::default());
}

#[test]
fn layouts_that_cannot_deploy_are_refused_naming_why() {
    let refused = |yaml: &str| layout(yaml).unwrap_err().to_string();
    // A group that calls a Lambda which calls back into it.
    let e = refused("lambda: {colocate: {core: [turn-orchestrator, session, auth-credentials]}}");
    assert!(
        e.starts_with("lambda.colocate.core: `turn-orchestrator` calls the providers' Lambdas, which call `auth-credentials` back while it waits"),
        "{e}"
    );
    let e = refused("lambda: {colocate: {summaries: [context-compaction, llm-budget]}}");
    assert!(
        e.contains("`context-compaction` calls the providers'"),
        "{e}"
    );
    let e = refused("lambda: {colocate: {core: [turn-orchestrator, tools]}}");
    assert!(e.starts_with("lambda.colocate.core: `tools` cannot share a Lambda: the tools run in their own sandboxed Lambda"), "{e}");
    let e = refused("lambda: {colocate: {core: [turn-orchestrator, sesion]}}");
    assert!(
        e.contains("`sesion` is not a worker that can share a Lambda (any of: turn-orchestrator,"),
        "{e}"
    );
    let e =
        refused("lambda: {colocate: {a: [turn-orchestrator, session], b: [session, llm-budget]}}");
    assert!(e.contains("`session` is also in group `a`"), "{e}");
    let e = refused("lambda: {colocate: {a: [policy, harness]}}");
    assert!(e.contains("at least two workers' Lambdas"), "{e}");
    let e = refused("lambda: {colocate: {Core: [turn-orchestrator, session]}}");
    assert!(
        e.starts_with("lambda.colocate.Core: a group's name is its Lambda's"),
        "{e}"
    );
    let e = refused("lambda: {colocat: {}}");
    assert!(
        e.starts_with("harness.yaml: lambda: unknown field `colocat`"),
        "{e}"
    );
    let e = refused("lambda: {colocate: {core: turn-orchestrator}}");
    assert!(e.starts_with("harness.yaml: lambda: invalid type"), "{e}");
    // A name another function of the template has.
    let e = colocate(
        &shipped(),
        &layout("lambda: {colocate: {session: [turn-orchestrator, hook-fanout]}}").unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("already named `session`"), "{e}");
}

#[test]
fn members_that_disagree_are_refused() {
    let function = |binary: &str, env: Value, extra: Value| {
        let mut f = json!({
            "Type": "AWS::Serverless::Function",
            "Metadata": {"BuildProperties": {"Binary": binary}},
            "Properties": {"FunctionName": {"Fn::Sub": format!("${{Prefix}}{binary}")}, "Environment": {"Variables": env}},
        });
        for (k, v) in extra.as_object().unwrap() {
            f["Properties"][k] = v.clone();
        }
        f
    };
    let two = layout("lambda: {colocate: {g: [session, llm-budget]}}").unwrap();
    let t = json!({"Resources": {
        "S": function("session", json!({"X": "1"}), json!({})),
        "B": function("llm-budget", json!({"X": "2"}), json!({})),
    }});
    let e = colocate(&t, &two).unwrap_err().to_string();
    assert!(
        e.contains("sets X to \"2\", another member to \"1\""),
        "{e}"
    );
    let t = json!({"Resources": {
        "S": function("session", json!({}), json!({"FunctionUrlConfig": {}})),
        "B": function("llm-budget", json!({}), json!({})),
    }});
    let e = colocate(&t, &two).unwrap_err().to_string();
    assert!(
        e.contains("has `FunctionUrlConfig`, which a shared function cannot take over"),
        "{e}"
    );
    let t = json!({"Resources": {"S": function("session", json!({}), json!({}))}});
    let e = colocate(&t, &two).unwrap_err().to_string();
    assert!(e.contains("0 functions of binary `llm-budget`"), "{e}");
}

#[test]
fn references_to_a_member_name_its_group() {
    let mut t = json!({
        "Ref": "A",
        "x": [{"Fn::GetAtt": ["A", "Arn"]}, {"Fn::Sub": "${A.Arn} ${A} ${AB}"}],
    });
    rewrite_references(
        &mut t,
        &BTreeMap::from([("A".to_string(), "G".to_string())]),
    );
    assert_eq!(
        t,
        json!({"Ref": "G", "x": [{"Fn::GetAtt": ["G", "Arn"]}, {"Fn::Sub": "${G.Arn} ${G} ${AB}"}]})
    );
}

#[test]
fn a_layouts_bootstrap_features_are_its_members_binaries() {
    assert_eq!(
        bootstrap_features(&layout(CORE).unwrap()),
        [
            "turn-orchestrator",
            "harness-worker",
            "session",
            "llm-budget",
            "hook-fanout",
            "auth-credentials",
            "models-catalog"
        ]
    );
    // Two groups share the bootstrap: the union; `policy` and `harness` are one binary.
    let two = layout(
        "lambda:\n  colocate:\n    a: [policy, harness, approval-gate]\n    b: [directory, context-compaction]\n",
    )
    .unwrap();
    assert_eq!(
        bootstrap_features(&two),
        [
            "harness-worker",
            "approval-gate",
            "directory",
            "context-compaction"
        ]
    );
    assert!(bootstrap_features(&LambdaLayout::default()).is_empty());
}
