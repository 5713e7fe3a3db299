#!/usr/bin/env bash
# The deployed shape on this machine: LocalStack (DynamoDB + Streams, SQS FIFO, Secrets
# Manager), every function of infra/template.yaml as its own bootstrap under the local Runtime
# API, the engine router behind an emulated API Gateway WebSocket API, the template's
# event-source mappings, and the Function URLs of the Slack webhook and of the standard doors
# (OpenAI chat, AG-UI, MCP, A2A; streaming) (engine-gateway deployed).
#   usage: localstack/deployed.sh up [Key=Value ...]|params [Key=Value ...]|down|status
#   Template parameters (SlackApprovers, SlackApproverChannels, SlackChannel, AllowedOrigins,
#   RunDefaults, Workspace, McpServers, BedrockModelArns, OtlpEndpoint, SlackApiBase,
#   DoorsApprovalWaitSecs) come
#   from `Key=Value` arguments after `up`, else from environment variables of the same name;
#   `up` prints which it used (values of Slack and MCP settings are not echoed).
#   LAMBDA_PROFILE  the bootstraps' cargo profile (default lambda, as deployed; ci-lambda
#                   builds several times faster)     HARNESS_AWS_PREFIX  (default harness-)
#   HARNESS_CONFIG  a harness.yaml whose `lambda.colocate` groups workers into shared Lambdas
#                   (`engine-gateway colocate` writes that template under target/deployed);
#                   default: ./harness.yaml when there is one, else infra/template.yaml as is
#   ANTHROPIC_BASE_URL, OPENAI_BASE_URL and the providers' API keys are passed to the
#   functions from this environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
export EMU_HOME=${EMU_HOME:-$CARGO_TARGET_DIR/aws-emu}
export HARNESS_AWS_PREFIX=${HARNESS_AWS_PREFIX:-harness-}
run="$CARGO_TARGET_DIR/deployed"
mkdir -p "$run"
pidfile="$run/deployed.pid"
log="$run/deployed.log"


# The template parameters to pass: `Key=Value` arguments, else same-named environment
# variables; says which (Slack and MCP values are not echoed). Sets `params`.
choose_params() {
  known=(SlackApprovers SlackApproverChannels SlackChannel AllowedOrigins RunDefaults Workspace
         McpServers BedrockModelArns OtlpEndpoint SlackApiBase DoorsApprovalWaitSecs)
  declare -A chosen=()
  for name in "${known[@]}"; do
    if [ -n "${!name:-}" ]; then chosen[$name]="${!name}"; fi
  done
  for arg in "$@"; do
    case "$arg" in
      *=*)
        key="${arg%%=*}"
        if [[ " ${known[*]} " != *" $key "* ]]; then
          echo "!! unknown template parameter \`$key\` (known: ${known[*]})" >&2; exit 2
        fi
        chosen[$key]="${arg#*=}" ;;
      *) echo "!! expected Key=Value, got \`$arg\`" >&2; exit 2 ;;
    esac
  done
  params=()
  if [ ${#chosen[@]} -eq 0 ]; then
    echo "template parameters: the template's defaults"
  else
    for key in "${!chosen[@]}"; do
      params+=(--parameter "$key=${chosen[$key]}")
      case "$key" in
        Slack*|McpServers) echo "template parameter: $key (set, ${#chosen[$key]} characters)" ;;
        *) echo "template parameter: $key=${chosen[$key]}" ;;
      esac
    done
  fi
}

case "${1:-up}" in
  up)
    shift || true
    choose_params "$@"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "already up (pid $(cat "$pidfile")):"; grep -E '^(websocket|token|slack webhook|doors):' "$log"; exit 0
    fi
    LAMBDA_PROFILE=${LAMBDA_PROFILE:-lambda} bash scripts/lambda-builds.sh
    cargo build --locked -q -p engine-gateway --bin engine-gateway
    template=infra/template.yaml
    config=${HARNESS_CONFIG:-}
    if [ -z "$config" ] && [ -f harness.yaml ]; then config=harness.yaml; fi
    if [ -n "$config" ]; then
      template="$run/template.yaml"
      "$CARGO_TARGET_DIR/debug/engine-gateway" colocate --config "$config" --out "$template"
      echo "template: $template (infra/template.yaml with $config's lambda.colocate)"
    fi
    bash localstack/emu.sh start
    source localstack/env.sh
    bash localstack/provision.sh "$HARNESS_AWS_PREFIX" >/dev/null
    nohup "$CARGO_TARGET_DIR/debug/engine-gateway" deployed --template "$template" --lambda-dir "$CARGO_TARGET_DIR/lambda" \
      --aws-prefix "$HARNESS_AWS_PREFIX" "${params[@]}" > "$log" 2>&1 &
    echo $! > "$pidfile"
    for _ in $(seq 1 240); do
      if grep -q '^token:' "$log"; then
        grep -E '^(websocket|token|slack webhook|doors):' "$log"
        echo "connect: ENGINE_URL=<websocket>/?token=<token>; logs: $log; stop: bash localstack/deployed.sh down"
        exit 0
      fi
      if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then echo "!! it stopped:"; tail -20 "$log"; exit 1; fi
      sleep 0.5
    done
    echo "!! not up after 120 s:"; tail -20 "$log"; exit 1
    ;;
  down)
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
    bash localstack/emu.sh stop
    ;;
  params)
    # What `up` would pass, without starting anything (tests/infra.rs checks it).
    shift; choose_params "$@"; printf '%s\n' "${params[@]}"
    ;;
  status)
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "up (pid $(cat "$pidfile"))"; grep -E '^(websocket|token|slack webhook|doors):' "$log"
    else
      echo "down"
    fi
    ;;
  *) echo "usage: $0 up [Key=Value ...]|down|status" >&2; exit 2 ;;
esac
