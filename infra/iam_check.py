"""Least privilege, checked: every AWS call a deployed function made in the tests against
the role `infra/template.yaml` gives that function, and every action a role grants against
the calls made.

    python infra/iam_check.py CALLS_DIR [--template infra/template.yaml] [--prefix P]
        [--stage local] [--grants infra/iam-grants.yaml] [--also GENERATED.yaml ...]

CALLS_DIR holds what each function process recorded (`HARNESS_API_CALLS_DIR`: bus-aws's
`api_calls`, one `<pid>.iam` per process: the function's name and each call's IAM
action and resource ARN). The roles are read from the template as SAM builds them: the SAM
policy templates (`DynamoDBCrudPolicy`, `SQSSendMessagePolicy`, …) expanded by AWS's own
translator (`samtranslator`, which cfn-lint brings), the template's intrinsics resolved for
the prefix, stage, region and account the local deployed shape uses, and each call decided
by moto's IAM policy evaluator (`moto.iam.access_control.IAMPolicy`, in LocalStack's venv).

Fails (exit 1), naming the function, action and resource, when:
- a call was made that the function's role does not allow (it would be denied on AWS);
- an action a role grants was used by no call and `infra/iam-grants.yaml` does not say why
  it is granted anyway (`<Function resource>: {<action>: <reason>}`, or under `"*"` for a
  reason every function shares), or that file explains a function's own grant that is used
  after all (keep it true).

`--also` adds a template `engine-gateway colocate` wrote (a co-located layout): the calls of
its own functions (the groups') are checked against their roles the same way. Their grants
are their members' statements, whose use the main template's check already holds to the
tests, so they are not checked for use a second time.
"""

import argparse
import fnmatch
import glob
import json
import os
import sys

import yaml

REGION = os.environ.get("AWS_REGION", "us-east-1")
ACCOUNT = "000000000000"  # bus::events::ACCOUNT: what the local shape's ARNs carry


def load_template(path):
    with open(path) as f:
        return yaml.safe_load(f)


class Resolver:
    """The intrinsics the template's policies use, resolved as the local shape names things."""

    def __init__(self, template, prefix, stage):
        self.t = template
        self.vars = {
            "Prefix": prefix,
            "Stage": stage,
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            # The emulated WebSocket API's id (aws-local's deployed.rs resolves it so).
            "WebSocketApi": "local",
        }
        for name, p in (template.get("Parameters") or {}).items():
            if "Default" in p and name not in self.vars:
                self.vars[name] = str(p["Default"])

    def props(self, logical):
        return self.t["Resources"][logical]["Properties"]

    def ref(self, name):
        if name in self.vars:
            return self.vars[name]
        res = self.t["Resources"].get(name)
        if res is None:
            raise KeyError(f"Ref {name}: no such parameter or resource")
        kind, p = res["Type"], res.get("Properties", {})
        if kind == "AWS::DynamoDB::Table":
            return self.value(p["TableName"])
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.value(p['QueueName'])}"
        if kind == "AWS::SecretsManager::Secret":
            return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{self.value(p['Name'])}"
        if kind == "AWS::ApiGatewayV2::Api":
            return "local"
        raise KeyError(f"Ref {name}: resources of type {kind} are not resolved here")

    def get_att(self, name, attr):
        kind, p = self.t["Resources"][name]["Type"], self.props(name)
        if kind == "AWS::DynamoDB::Table":
            table = self.value(p["TableName"])
            arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"
            return {"Arn": arn, "StreamArn": f"{arn}/stream/*"}[attr]
        if kind == "AWS::SQS::Queue":
            q = self.value(p["QueueName"])
            return {"Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{q}", "QueueName": q}[attr]
        raise KeyError(f"GetAtt {name}.{attr}: not resolved here")

    def sub(self, text, extra):
        out, rest = "", text
        while "${" in rest:
            i = rest.index("${")
            j = rest.index("}", i)
            name = rest[i + 2 : j]
            if name in extra:
                val = self.value(extra[name])
            elif "." in name:
                val = self.get_att(*name.split(".", 1))
            else:
                val = self.ref(name)
            out += rest[:i] + val
            rest = rest[j + 1 :]
        return out + rest

    def value(self, v):
        if isinstance(v, str):
            return v
        if isinstance(v, (int, float, bool)):
            return str(v)
        if isinstance(v, dict) and len(v) == 1:
            (k, arg), = v.items()
            if k == "Ref":
                return self.ref(arg)
            if k == "Fn::Sub":
                if isinstance(arg, list):
                    return self.sub(arg[0], arg[1])
                return self.sub(arg, {})
            if k == "Fn::GetAtt":
                name, attr = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.get_att(name, attr)
            if k == "Fn::Join":
                return arg[0].join(self.value(x) for x in arg[1])
        raise ValueError(f"cannot resolve {v!r}")

    def deep(self, v):
        """A policy document with every intrinsic resolved."""
        if isinstance(v, list):
            return [self.deep(x) for x in v]
        if isinstance(v, dict):
            if len(v) == 1 and next(iter(v)) in ("Ref", "Fn::Sub", "Fn::GetAtt", "Fn::Join"):
                return self.value(v)
            return {k: self.deep(x) for k, x in v.items()}
        return v


def role_documents(template, logical, resolver, processor):
    """The function's policies as IAM documents: SAM templates expanded, statements as written."""
    docs = []
    for p in template["Resources"][logical]["Properties"].get("Policies", []):
        if isinstance(p, str):
            raise ValueError(f"{logical}: managed policy {p} is not checked here")
        for name, params in p.items():
            if name == "Statement":
                doc = {"Version": "2012-10-17", "Statement": params}
            else:
                doc = processor.convert(name, params)
                doc.setdefault("Version", "2012-10-17")
            docs.append(resolver.deep(doc))
    return docs


def granted_actions(docs):
    for d in docs:
        for st in d["Statement"] if isinstance(d["Statement"], list) else [d["Statement"]]:
            if st.get("Effect") != "Allow":
                continue
            acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            yield from acts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calls_dir")
    ap.add_argument("--template", default="infra/template.yaml")
    ap.add_argument("--prefix", default=None, help="only functions of this prefix")
    ap.add_argument("--stage", default="local")
    ap.add_argument("--grants", default="infra/iam-grants.yaml")
    ap.add_argument("--also", action="append", default=[], help="a generated template too")
    args = ap.parse_args()

    from moto.iam.access_control import IAMPolicy, PermissionResult
    from samtranslator.policy_template_processor.processor import PolicyTemplatesProcessor

    processor = PolicyTemplatesProcessor(PolicyTemplatesProcessor.get_default_policy_templates_json())
    template = load_template(args.template)
    with open(args.grants) as f:
        explained = yaml.safe_load(f) or {}

    # What each deployed function (by name) did, over every test's stack (each its own prefix).
    calls_by_name = {}
    for path in glob.glob(os.path.join(args.calls_dir, "*.iam")):
        with open(path) as f:
            rec = json.load(f)
        name = rec.get("function")
        if not name:
            continue  # not a Lambda process (the test host's emulators)
        calls_by_name.setdefault(name, {}).update(
            {(c["action"], c["resource"]): True for c in rec["calls"]}
        )

    functions = {
        logical: r
        for logical, r in template["Resources"].items()
        if r["Type"] == "AWS::Serverless::Function"
    }
    # The generated templates' own functions, with the template each comes from.
    home = {logical: template for logical in functions}
    for path in args.also:
        extra = load_template(path)
        for logical, r in extra["Resources"].items():
            if r["Type"] == "AWS::Serverless::Function" and logical not in functions:
                functions[logical] = r
                home[logical] = extra
    problems, used, checked = [], {}, 0
    for name, calls in sorted(calls_by_name.items()):
        # Which template function this is: its FunctionName is `${Prefix}<suffix>`.
        match = None
        for logical, r in functions.items():
            pattern = r["Properties"]["FunctionName"]["Fn::Sub"].replace("${Prefix}", "*")
            if fnmatch.fnmatchcase(name, pattern) and (
                match is None or len(pattern) > len(match[1])
            ):
                match = (logical, pattern)
        if match is None:
            problems.append(f"{name}: no function of the template has this name")
            continue
        logical = match[0]
        prefix = name[: len(name) - len(match[1]) + 1]
        if args.prefix and prefix != args.prefix:
            continue
        resolver = Resolver(home[logical], prefix, args.stage)
        docs = role_documents(home[logical], logical, resolver, processor)
        policies = [IAMPolicy(json.dumps(d)) for d in docs]
        for action, resource in sorted(calls):
            checked += 1
            results = [p.is_action_permitted(action, resource) for p in policies]
            if PermissionResult.DENIED in results or PermissionResult.PERMITTED not in results:
                problems.append(
                    f"{logical} ({name}): {action} on {resource} is not allowed by its role"
                )
            used.setdefault(logical, set()).add(action)

    # Every function's grants, those no test invoked included (actions do not depend on
    # the prefix).
    any_prefix = Resolver(template, "x-", args.stage)
    for logical in sorted(functions):
        if home[logical] is not template:
            continue
        docs = role_documents(template, logical, any_prefix, processor)
        for action in sorted(set(granted_actions(docs))):
            covered = any(fnmatch.fnmatchcase(u, action) for u in used.get(logical, ()))
            own = (explained.get(logical) or {}).get(action)
            why = own or (explained.get("*") or {}).get(action)
            if not covered and not why:
                problems.append(
                    f"{logical}: grants {action}, which no call in the tests used; "
                    f"remove it or say why in {args.grants}"
                )
            if covered and own:
                problems.append(
                    f"{logical}: {args.grants} explains {action} as unused, but a call used it"
                )

    print(
        f"IAM: {checked} distinct calls of {len(used)} of {len(functions)} functions checked "
        f"against their roles; "
        f"{len(problems)} problems"
    )
    for p in problems:
        print("  " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
