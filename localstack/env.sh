# Source this to point AWS clients at the local emulator.
export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://127.0.0.1:4566}
export AWS_REGION=${AWS_REGION:-us-east-1}
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}
export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
# Credentials come from the variables above: never ask an instance metadata endpoint.
export AWS_EC2_METADATA_DISABLED=true
