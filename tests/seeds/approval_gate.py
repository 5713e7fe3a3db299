"""The seeds' approval gate, written with the iii SDK (PyPI `iii-sdk`, pinned in
tests/clients/requirements.lock) exactly as the seeds describe it, and nothing of ours:

    approval::resolve {session_id, function_call_id, decision: allow|deny|aborted, reason?}
      -> writes approvals/<session_id>/<function_call_id> = {decision, reason}  (reason: null
         when none is given) and answers {ok: true}
    approval::list_pending {session_id?} -> {pending: []}  (the seeds' gate keeps no list)

Run: python approval_gate.py <ws url>, with III_TOKEN set to a credential granted the
`approval` namespace. Prints "registered" once it has asked for both (the test waits until the engine lists them).
"""

import sys
import time

from iii import register_worker
from iii.iii_constants import InitOptions

DECISIONS = ("allow", "deny", "aborted")

worker = register_worker(
    sys.argv[1],
    InitOptions(
        worker_name="seeds-approval-gate",
        enable_metrics_reporting=False,
        otel={"enabled": False},
    ),
)


async def resolve(data):
    sid = data.get("session_id")
    cid = data.get("function_call_id")
    decision = data.get("decision")
    if not isinstance(sid, str) or not isinstance(cid, str) or decision not in DECISIONS:
        return {"ok": False, "error": "invalid_payload"}
    await worker.trigger_async(
        {
            "function_id": "state::set",
            "payload": {
                "scope": "approvals",
                "key": f"{sid}/{cid}",
                "value": {"decision": decision, "reason": data.get("reason")},
            },
        }
    )
    return {"ok": True}


async def list_pending(data):
    return {"pending": []}


worker.register_function("approval::resolve", resolve)
worker.register_function("approval::list_pending", list_pending)
print("registered", flush=True)
while True:
    time.sleep(3600)
