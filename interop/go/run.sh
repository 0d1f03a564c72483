#!/usr/bin/env bash
# Build the Go agent loop from Debian's packages (offline, GOPATH mode) and run it against a
# server started here. Installs the Debian packages when they are missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES="golang-go golang-google-grpc-dev golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler"
if ! command -v go >/dev/null || ! command -v protoc-gen-go-grpc >/dev/null \
   || [ ! -d /usr/share/gocode/src/google.golang.org/grpc ]; then
  apt-get update -qq && apt-get install -y -qq $PACKAGES
fi
WORK=$(mktemp -d)
trap 'kill "${SERVER_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src/agentloop"
# go_package decides where the generated code goes (paths=import).
protoc -I protos -I /usr/include \
  --go_out="$WORK/src" --go_opt=paths=import \
  --go-grpc_out="$WORK/src" --go-grpc_opt=paths=import \
  protos/bidi_responses/v1/responses.proto
cp interop/go/agentloop/main.go "$WORK/src/agentloop/"
(cd "$WORK/src/agentloop" && GO111MODULE=off GOPATH="$WORK:/usr/share/gocode" GOCACHE="$WORK/cache" \
  go build -o "$WORK/agentloop" .)
PORT_FILE="$WORK/server.log"
.venv/bin/bidi-responses serve --no-http --grpc-port 0 --data-dir "$WORK/data" \
  --sim-tps 100000 --sim-ttft-ms 0 >"$PORT_FILE" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  grep -q "listening" "$PORT_FILE" && break
  sleep 0.1
done
PORT=$(sed -n 's/.*gRPC on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$PORT_FILE" | head -1)
[ -n "$PORT" ] || { cat "$PORT_FILE"; exit 1; }
"$WORK/agentloop" "127.0.0.1:$PORT" 5
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
echo "interop: Go agent loop passed"
